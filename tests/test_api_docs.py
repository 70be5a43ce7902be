"""README.md stays true: the options table, the two set-up commands, the demo command."""

from __future__ import annotations

import re
from pathlib import Path

from adaptive_eager.cli import options_markdown

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_options_table_is_generated_from_config():
    block = README.split("<!-- options-table:begin -->")[1].split("<!-- options-table:end -->")[0]
    assert block.strip() == options_markdown().strip(), \
        "regenerate with: adaptive-eager options --markdown"


def test_readme_setup_commands_match_ci():
    assert "adaptive-eager demo" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[test]"' in ci and "pytest -q" in ci and " tests" in ci
    commands = re.findall(r"```bash\n(python3 -m venv .*)\n```", README)
    assert len(commands) == 2
    assert commands[0].endswith("pip install -e . && adaptive-eager demo")
    assert commands[1].endswith('pip install -e ".[test]" && python -m pytest -q tests')


def test_readme_has_benchmark_placeholder():
    assert "## Benchmarks" in README
