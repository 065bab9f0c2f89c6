"""Lightning's import table (shared/API.md, the porting contract; docs/from-lightning.md, "Every Lightning import").

Without Lightning: every row resolves to the object it names, or refuses with an ImportError that carries its note,
and docs/from-lightning.md holds the table generated from the rows. With Lightning 2.x installed (the dev oracle):
the rows are exactly Lightning's public names, found by the rule docs/from-lightning.md states, and the enums that
keep Lightning's name have Lightning's members.
"""

from __future__ import annotations

import ast
import importlib
import logging
import pkgutil
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from strategies.from_lightning import CLASS_RENAMES, Row, exported_name, status
from trainer.from_lightning import BEGIN, END, all_tables, markdown_table

ROOT = Path(__file__).resolve().parents[2]
TABLES = all_tables()
ROWS = [(package, name) for package, table in TABLES.items() for name in table]

# The contract's table: the first segment after `lightning.pytorch` picks our package (shared/API.md).
PACKAGE_OF = {"": "trainer", "core": "trainer", "trainer": "trainer", "utilities": "trainer", "callbacks": "callbacks",
              "loggers": "trainer.loggers", "plugins": "strategies", "strategies": "strategies",
              "tuner": "trainer.tuner", "profilers": "trainer.profilers", "cli": "trainer.cli"}
LIGHTNING_PACKAGES = ("lightning", "lightning_fabric")


def _row(package: str, name: str) -> Row:
    return TABLES[package][name]


def _target(row: Row, name: str) -> Any:
    return getattr(importlib.import_module(row.module), row.attribute or exported_name(name))


def _import_from(package: str, name: str) -> Any:
    scope: dict[str, Any] = {}
    exec(f"from {package} import {name}", scope)  # the statement a port runs, not getattr
    return scope[name]


@pytest.mark.parametrize(("package", "name"), [r for r in ROWS if _row(*r).module])
def test_a_name_with_an_equivalent_imports_as_that_object(package: str, name: str):
    row = _row(package, name)
    ours = exported_name(name)
    assert _import_from(package, ours) is _target(row, name)
    assert getattr(importlib.import_module(package), ours) is _target(row, name)


@pytest.mark.parametrize(("package", "name"), [r for r in ROWS if not _row(*r).module])
def test_a_refused_name_raises_an_import_error_that_says_what_to_use(package: str, name: str):
    note = _row(package, name).note
    with pytest.raises(ImportError, match="cannot import name") as raised:
        _import_from(package, name)
    assert note in str(raised.value) and name in str(raised.value)
    module = importlib.import_module(package)
    assert not hasattr(module, name) and getattr(module, name, None) is None
    with pytest.raises(AttributeError, match="has no counterpart"):
        getattr(module, name)


@pytest.mark.parametrize(("package", "lightning_name"), [("trainer", "LightningModule"),
                                                         ("trainer", "LightningDataModule"),
                                                         ("callbacks", "TQDMProgressBar")])
def test_a_renamed_class_under_lightnings_name_names_ours(package: str, lightning_name: str):
    with pytest.raises(ImportError, match=f"called {CLASS_RENAMES[lightning_name]} here"):
        _import_from(package, lightning_name)
    assert not hasattr(importlib.import_module(package), lightning_name)


def test_an_unknown_name_is_an_ordinary_attribute_error():
    import callbacks
    import strategies
    import trainer

    for module in (trainer, callbacks, strategies, importlib.import_module("trainer.loggers")):
        assert not hasattr(module, "NoSuchName") and getattr(module, "__wrapped__", None) is None
        with pytest.raises(ImportError, match="cannot import name 'NoSuchName'"):
            _import_from(module.__name__, "NoSuchName")


def test_dir_lists_the_names_that_resolve_and_not_the_refused_ones():
    import strategies
    import trainer

    assert {"STEP_OUTPUT", "TrainerFn", "Callback", "Trainer"} <= set(dir(trainer))
    assert "ParallelStrategy" in dir(strategies) and "XLAPrecision" not in dir(strategies)


def test_every_status_is_one_of_the_four():
    assert {status(name, _row(package, name)) for package, name in ROWS} == {"same", "renamed", "equivalent",
                                                                             "refused"}


def test_the_docs_hold_the_table_generated_from_the_rows():
    fresh = BEGIN + markdown_table() + END in (ROOT / "docs" / "from-lightning.md").read_text()
    assert fresh, "docs/from-lightning.md's import table is stale: python -m trainer.from_lightning --write " \
                  "docs/from-lightning.md"


# --- against an installed Lightning -------------------------------------------------------------------------------

def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements that run at import, inside plain `if`/`try` blocks too (not `if TYPE_CHECKING` or `__main__`)."""
    out: list[ast.stmt] = []
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" not in test and "__name__" not in test:
                pending[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending[:0] = node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody
        else:
            out.append(node)
    return out


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _reexports(node: ast.stmt, used: set[str]) -> list[str]:
    """Names imported from Lightning (or Lightning Fabric) that the module never uses: imported to be exported."""
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
            and node.module.split(".")[0] in LIGHTNING_PACKAGES:
        return [a.asname or a.name for a in node.names if (a.asname or a.name) not in used]
    return []


def public_names(module: Any) -> list[str]:
    """docs/from-lightning.md's rule: `__all__` where the module has one; else the names its own top-level code
    defines and the Lightning names it imports only to export, without a leading underscore, leaving out module
    loggers, warning caches and type variables."""
    if hasattr(module, "__all__"):
        return sorted(n for n in module.__all__ if not n.startswith("_"))
    tree = ast.parse(Path(module.__file__).read_text())
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names = {name for node in _top_level(tree) for name in [*_bound_names(node), *_reexports(node, used)]}
    from lightning.fabric.utilities.rank_zero import WarningCache

    return sorted(n for n in names if not n.startswith("_")
                  and not isinstance(getattr(module, n, None), (logging.Logger, WarningCache, typing.TypeVar)))


def lightning_names() -> dict[tuple[str, str], list[str]]:
    """(our package, Lightning's name) -> the Lightning modules (under lightning.pytorch) that export it."""
    pl = pytest.importorskip("lightning.pytorch")
    found: dict[tuple[str, str], list[str]] = {}
    modules = [""] + [info.name.removeprefix("lightning.pytorch.")
                      for info in pkgutil.walk_packages(pl.__path__, "lightning.pytorch.")]
    for path in modules:
        parts = path.split(".") if path else [""]
        if parts[0] not in PACKAGE_OF or any(p.startswith("_") for p in parts):
            continue  # demos, accelerators, loops, overrides, serve and private modules are outside the contract
        module = importlib.import_module(".".join(["lightning.pytorch", *([path] if path else [])]))
        for name in public_names(module):
            found.setdefault((PACKAGE_OF[parts[0]], name), []).append(path)
    return found


def test_the_rows_are_exactly_lightnings_public_names():
    expected = lightning_names()
    ours = {(package, name): sorted(_row(package, name).lightning) for package, name in ROWS}
    missing = sorted(set(expected) - set(ours))
    extra = sorted(set(ours) - set(expected))
    wrong_modules = sorted(key for key in set(ours) & set(expected) if ours[key] != sorted(expected[key]))
    assert (missing, extra, wrong_modules) == ([], [], [])


def _enum_rows() -> list[tuple[str, str]]:
    return [(p, n) for p, n in ROWS if _row(p, n).module and not _row(p, n).note and exported_name(n) == n
            and isinstance(_target(_row(p, n), n), type) and issubclass(_target(_row(p, n), n), Enum)]


@pytest.mark.parametrize(("package", "name"), _enum_rows())
def test_an_enum_with_lightnings_name_has_lightnings_members(package: str, name: str):
    pytest.importorskip("lightning.pytorch")
    row = _row(package, name)
    module = row.lightning[-1]
    theirs = getattr(importlib.import_module(f"lightning.pytorch.{module}".rstrip(".")), name)
    ours = _target(row, name)
    assert {m.name: m.value for m in ours} == {m.name: m.value for m in theirs}
