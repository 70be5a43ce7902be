"""The import direction holds (DESIGN.md, issue 11): leaves <- fusion <- runtime <- dispatch
<- the public surface; nothing inner imports anything outer, not even inside a function."""

from __future__ import annotations

import ast
import pathlib

import adaptive_eager

PKG = pathlib.Path(adaptive_eager.__file__).parent
# Leaves import nothing of the package but other leaves; the emulated device is a leaf too
# (a device, usable by every layer), and so is the hooks registry (every layer declares
# its process-wide patches as rows of it).
LEAVES = {"config", "_env", "_logging", "reasons", "neuron_sim", "hooks"}
ORDER = {"leaf": 0, "fusion": 1, "runtime": 2, "dispatch": 3, "surface": 4}


def _layer(parts: list[str]) -> str:
    head = parts[0] if parts else ""
    if head in LEAVES:
        return "leaf"
    if head in ("fusion", "runtime", "dispatch"):
        return head
    return "surface"


def _imports(path: pathlib.Path) -> list[tuple[list[str], int]]:
    """(module path inside the package, line) of every package import in ``path``."""
    rel = path.relative_to(PKG).with_suffix("").parts
    here = list(rel[:-1]) if rel[-1] != "__init__" else list(rel[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
                target = base + (node.module.split(".") if node.module else [])
                if not node.module:  # from . import x, y
                    for alias in node.names:
                        out.append((target + [alias.name], node.lineno))
                    continue
                out.append((target, node.lineno))
            elif node.module and node.module.split(".")[0] == "adaptive_eager":
                out.append((node.module.split(".")[1:], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "adaptive_eager":
                    out.append((alias.name.split(".")[1:], node.lineno))
    return out


def test_inner_layers_never_import_outer_ones():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = list(path.relative_to(PKG).with_suffix("").parts)
        mine = _layer(rel)
        for target, line in _imports(path):
            if not target or target == [""]:
                continue  # the package itself (its lazy __init__)
            theirs = _layer(target)
            if ORDER[theirs] > ORDER[mine] and not (mine == "leaf" and theirs == "leaf"):
                bad.append(f"{path.relative_to(PKG)}:{line} ({mine}) imports "
                           f"{'.'.join(target)} ({theirs})")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_violation():
    """The scan is not vacuous: it resolves relative imports of every depth."""
    rel = _imports(PKG / "runtime" / "compiled.py")
    assert ["fusion", "partition"] in [t for t, _ in rel]
    assert _layer(["dispatch", "mode"]) == "dispatch" and ORDER["dispatch"] > ORDER["runtime"]


def _module_imports(path: pathlib.Path) -> set[str]:
    """Package modules ``path`` imports, at module level or inside functions."""
    return {".".join(t) for t, _ in _imports(path)}


def test_no_import_cycles_between_modules():
    """issue 11: dispatch/dynamo.py and dispatch/mode.py imported each other (one of
    them inside a function, which hides a cycle from Python, not from a reader)."""
    modules = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("").parts
        name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        modules[name] = path
    graph = {name: {t for t in _module_imports(path) if t in modules and t != name}
             for name, path in modules.items()}
    # a package's __init__ re-exporting its modules is not a cycle with them
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".") and t != ""}
    state: dict[str, int] = {}
    cycles = []

    def visit(n: str, trail: list[str]) -> None:
        state[n] = 1
        for t in graph[n]:
            if state.get(t) == 1:
                cycles.append(" -> ".join(trail[trail.index(t):] + [t]) if t in trail else t)
            elif t not in state:
                visit(t, trail + [t])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert not cycles, cycles


def test_every_note_referenced_is_defined():
    """Notes are referenced by name (STYLE.md): every ``Note [Title]`` cited in the package
    is defined somewhere (a ``# Note [Title]`` block or a docstring's ``Note [Title]`` line)."""
    import re

    cited, defined = set(), set()
    for path in PKG.rglob("*.py"):
        for line in path.read_text().splitlines():
            cited.update(re.findall(r"Note \[([^\]]+)\]", line))
            m = re.match(r"^\s*(?:# )?Note \[([^\]]+)\](?:\s*$|:)", line)
            if m:
                defined.add(m.group(1))
    assert cited - defined == set(), sorted(cited - defined)
