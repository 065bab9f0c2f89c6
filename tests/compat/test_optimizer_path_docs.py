"""docs/from-lightning.md's table for the optimizer path names a test for every row, and every test it names
exists: the table cannot drift from the tests."""

from __future__ import annotations

import ast
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "from-lightning.md"
_REF = re.compile(r"`(?:(test_\w+)\.py)?::(test_\w+)`")


def _rows() -> list[str]:
    section = DOC.read_text().split("### The optimizer path\n", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def _test_names(module: str) -> set[str]:
    """The test functions a module defines, read from its source (importing it could skip, e.g. without Lightning)."""
    tree = ast.parse((DOC.parents[1] / "tests" / "compat" / f"{module}.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_row_names_tests_that_exist():
    rows = _rows()
    assert len(rows) >= 14
    for row in rows:
        refs, module = _REF.findall(row), None
        assert refs, f"no test named in: {row[:60]}"
        for file, name in refs:
            module = file or module  # `::name` continues the file named before it
            assert name in _test_names(module), f"{module}::{name} (named in docs/from-lightning.md)"
