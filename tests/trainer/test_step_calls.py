"""The steady training step's own Python work stays small (issue 43): the calls into our packages per step are
counted, and a hook that nobody overrides costs no call at all.

The instruction ruler (benchmarks/instructions.py) measures what these calls cost; these tests keep the count from
creeping back up unnoticed. The budget is the count after issue 43's cuts (34 calls per steady step: 62 before) plus
a small margin. If a new guarantee or Lightning behaviour needs more, raise it here together with the ruler's new
figures in docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tests.helpers.boring import QUIET
from trainer import Trainer, TrainModule
from trainer.loops import automatic_optimization, fit_loop

ROOT = Path(__file__).resolve().parents[2]
OURS = tuple(f"{ROOT / package}/" for package in ("trainer", "strategies", "callbacks"))
FIRST, LAST = 4, 14  # the steady steps counted: after step FIRST's end, through step LAST's end
CALL_BUDGET = 38


class Plain(TrainModule):
    """Overrides nothing but training_step and configure_optimizers."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8 * 20, 8), torch.randn(8 * 20, 1)), batch_size=8)


class _CountOurCalls(Callback):
    """Counts, with sys.setprofile, the calls of functions in our packages between two steady batch ends."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(OURS):
            self.calls[f"{Path(frame.f_code.co_filename).relative_to(ROOT)}:{frame.f_code.co_name}"] += 1

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == FIRST:
            sys.setprofile(self._profile)
        elif batch_idx == LAST:
            sys.setprofile(None)


def test_a_steady_step_calls_our_code_no_more_than_the_budget() -> None:
    counter = _CountOurCalls()
    try:
        Trainer(**QUIET, max_epochs=1, callbacks=[counter]).fit(Plain(), _data())
    finally:
        sys.setprofile(None)
    per_step = sum(counter.calls.values()) / (LAST - FIRST)
    assert per_step <= CALL_BUDGET, counter.calls.most_common()


def test_hooks_nobody_overrides_are_not_dispatched_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first step resolved them, on_train_batch_start/end, on_before_zero_grad, on_before/after_backward
    and on_before_optimizer_step reach call_hook only when someone overrides them."""
    dispatched: Counter[str] = Counter()
    steady = {"on": False}

    def counting(module: Any) -> Any:
        original = module.call_hook

        def call_hook(loop: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            if steady["on"]:
                dispatched[name] += 1
            return original(loop, name, *args, **kwargs)

        return call_hook

    for module in (fit_loop, automatic_optimization):
        monkeypatch.setattr(module, "call_hook", counting(module))

    class Steady(Plain):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            steady["on"] = batch_idx >= 2
            return super().training_step(batch, batch_idx)

    Trainer(**QUIET, max_epochs=1).fit(Steady(), _data())
    per_step = {"on_train_batch_start", "on_train_batch_end", "on_before_zero_grad", "on_before_backward",
                "on_after_backward", "on_before_optimizer_step"}
    assert {name: n for name, n in dispatched.items() if name in per_step} == {}


def test_a_hook_someone_overrides_is_still_dispatched_every_step() -> None:
    seen: Counter[str] = Counter()

    class Watch(Callback):
        def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
            seen["on_before_backward"] += 1

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            seen["on_before_optimizer_step"] += 1

    Trainer(**QUIET, max_epochs=1, callbacks=[Watch()]).fit(Plain(), _data())
    assert seen == {"on_before_backward": 20, "on_before_optimizer_step": 20}
