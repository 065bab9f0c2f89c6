"""docs/from-lightning.md's name tables cannot drift: every Lightning name in trainer/setup/lightning_names.py has
exactly one row with the same kind and status; every row names a test that exists and covers that name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from trainer.setup.lightning_names import (
    CALLBACK_NAMES,
    DATAMODULE_NAMES,
    MODULE_NAMES,
    REMOVED_CALLBACK_NAMES,
    REMOVED_MODULE_NAMES,
)

ROOT = Path(__file__).resolve().parents[2]
_ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| ([^|]+?) \| (.+?) \|$")
_TABLES = {"LightningModule": {**MODULE_NAMES, **REMOVED_MODULE_NAMES}, "LightningDataModule": DATAMODULE_NAMES,
           "Callback": {**CALLBACK_NAMES, **REMOVED_CALLBACK_NAMES}}
# a test parametrized over a table covers the names of that table without spelling them out
_TABLE_VARIABLES = {"LightningModule": "MODULE_NAMES", "LightningDataModule": "DATAMODULE_NAMES",
                    "Callback": "CALLBACK_NAMES"}


def _rows() -> dict[str, list[tuple[str, str, str, str]]]:
    text = (ROOT / "docs" / "from-lightning.md").read_text()
    section = text.split("\n## Every LightningModule, DataModule and Callback name\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[tuple[str, str, str, str]]] = {name: [] for name in _TABLES}
    current = None
    for line in section.splitlines():
        if line.startswith("### "):
            current = line[4:].split(":")[0].strip()
        elif (match := _ROW.match(line)) and current is not None:
            rows[current].append(match.groups())
    return rows


ROWS = _rows()


@pytest.mark.parametrize("table", sorted(_TABLES))
def test_every_name_has_exactly_one_row(table: str):
    names = [row[0] for row in ROWS[table]]
    assert sorted(names) == sorted(_TABLES[table])


@pytest.mark.parametrize("table", sorted(_TABLES))
def test_every_row_has_the_kind_and_status_of_the_name_table(table: str):
    wrong = [row for row in ROWS[table] if (row[1], row[2]) != tuple(_TABLES[table][row[0]][:2])]
    assert wrong == []


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


@pytest.mark.parametrize("table", sorted(_TABLES))
def test_every_row_names_a_test_that_exists_and_covers_it(table: str):
    problems = []
    for name, _kind, _status, test in ROWS[table]:
        match = re.fullmatch(r"`(tests/compat/\w+\.py)::(\w+)`", test)
        if match is None:
            problems.append(f"{name}: test cell {test!r} is not `tests/compat/<file>.py::<test>`")
            continue
        path = ROOT / match.group(1)
        if not path.exists() or match.group(2) not in _defined_tests(path):
            problems.append(f"{name}: {match.group(1)}::{match.group(2)} does not exist")
        elif name not in path.read_text() and _TABLE_VARIABLES[table] not in path.read_text():
            problems.append(f"{name}: {match.group(1)} never mentions it")
    assert problems == []


@pytest.mark.parametrize("table", sorted(_TABLES))
def test_every_refused_name_has_its_note_in_the_docs(table: str):
    text = (ROOT / "docs" / "from-lightning.md").read_text()
    missing = [name for name, entry in _TABLES[table].items()
               if entry.status == "refused" and f"- `{name}`: {entry.note}." not in text]
    assert missing == []
