"""The architecture's rules that a grep can check: strategies are split by mechanism, not by flags inside them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ROOT / "strategies"


def _lines(path: Path) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if not line.lstrip().startswith("#")]


def test_no_strategy_branches_on_its_stage():
    """A ZeRO stage picks its class at construction; no method asks `self.stage` which one it is."""
    branch = re.compile(r"\bif\b.*\bself\.stage\b|\bself\.stage\s*(==|!=|<|>|in\b|not\s+in\b)")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(STRATEGIES.glob("*.py"))
             for n, line in _lines(path) if branch.search(line)]
    assert found == []


def test_ddp_strategy_tests_no_wrapper_type():
    """DDPStrategy always wraps with DDP, so it never asks which wrapper its model has."""
    found = [f"ddp.py:{n}: {line.strip()}" for n, line in _lines(STRATEGIES / "ddp.py") if "isinstance(" in line]
    assert found == []


def _private_reads(path: Path) -> list[tuple[int, str, str]]:
    """(line, receiver, attribute) of every `receiver._name` in a file (dunders excluded)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append((node.lineno, ast.unparse(node.value), node.attr))
    return found


def _product_files() -> list[Path]:
    return sorted(p for package in ("trainer", "callbacks", "strategies") for p in (ROOT / package).rglob("*.py"))


def _names_the_trainer(receiver: str) -> bool:
    """`trainer`, `self.trainer`, `self._trainer`, `loop.trainer`, ...: an expression that is the Trainer."""
    return receiver.rsplit(".", 1)[-1] in ("trainer", "_trainer")


def test_only_trainer_py_reads_private_attributes_of_the_trainer():
    """The loops take the FitState; what other modules need from the Trainer is public."""
    found = [f"{path.relative_to(ROOT)}:{line}: {receiver}.{attr}" for path in _product_files()
             if path != ROOT / "trainer" / "trainer.py"
             for line, receiver, attr in _private_reads(path) if _names_the_trainer(receiver)]
    # properties.py is a mixin of the Trainer: it reads public state only, so `self._x` there is the Trainer's too
    found += [f"trainer/properties.py:{line}: self.{attr}" for line, receiver, attr in
              _private_reads(ROOT / "trainer" / "properties.py") if receiver == "self"]
    assert found == []


def test_callbacks_read_no_private_attribute_of_anything_but_themselves():
    """A third-party callback can do what ours do: everything they read is public."""
    found = [f"{path.name}:{line}: {receiver}.{attr}" for path in sorted((ROOT / "callbacks").glob("*.py"))
             for line, receiver, attr in _private_reads(path) if receiver not in ("self", "cls")]
    assert found == []


def test_design_doc_maps_every_module():
    """docs/design.md has one line per file of the three packages: a new module gets its line."""
    text = (ROOT / "docs" / "design.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in _product_files() if f"| `{p.relative_to(ROOT)}` |" not in text]
    assert missing == []
