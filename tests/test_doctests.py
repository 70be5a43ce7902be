"""Every docstring example in the package runs (issue 11: they were written, not run).

One test per module, so a failure names it; doctest prints the failing example."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import adaptive_eager


def _modules() -> list[str]:
    names = [adaptive_eager.__name__]
    for info in pkgutil.walk_packages(adaptive_eager.__path__, adaptive_eager.__name__ + "."):
        if not info.name.endswith(".__main__"):  # importing one runs the program
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
