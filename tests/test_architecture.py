"""The architecture's rules that a grep can check: strategies are split by mechanism, not by flags inside them."""

from __future__ import annotations

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
