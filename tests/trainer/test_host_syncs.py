"""The steady-state training step never waits for the device unless a feature asks for it: on CPU, as a proxy that
runs in CI, no `Tensor.item()` or `Tensor.__bool__` call happens in a step (each is a host sync on CUDA), with or
without `self.log` every step and a logger flushing every `log_every_n_steps`; `terminate_on_nan=True` asks for
exactly one check per step. With CUDA, `torch.cuda.set_sync_debug_mode("error")` around every steady batch checks
the real thing (skipped without a GPU)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tests.helpers.boring import QUIET
from tests.helpers.runif import run_if
from trainer import Trainer, TrainModule
from trainer.loggers import CSVLogger

STEADY_FROM, STEPS = 5, 40


class Counted(TrainModule):
    def __init__(self, log: bool, counts: collections.Counter) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)
        self.log_every_step, self.counts = log, counts

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.counts["steady"] = batch_idx >= STEADY_FROM
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.log_every_step:
            self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@contextmanager
def counting(counts: collections.Counter) -> Iterator[None]:
    """Count item() and bool() on tensors while counts["steady"] is set (from the steady state's first step on)."""
    originals = {name: getattr(torch.Tensor, name) for name in ("item", "__bool__")}

    def wrap(name: str) -> Any:
        def counted(self: torch.Tensor, *args: Any) -> Any:
            if counts["steady"]:
                counts[name] += 1
            return originals[name](self, *args)
        return counted

    for name in originals:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


@pytest.mark.parametrize(("log", "flags", "per_step"), [
    (False, {}, 0),
    (True, {}, 0),
    (True, {"terminate_on_nan": True}, 1),
])
def test_host_syncs_per_steady_step(tmp_path: Path, log: bool, flags: dict[str, Any], per_step: int) -> None:
    counts: collections.Counter = collections.Counter()
    data = DataLoader(TensorDataset(torch.randn(8 * STEPS, 8), torch.randn(8 * STEPS, 1)), batch_size=8)
    logger = CSVLogger(str(tmp_path)) if log else False
    with counting(counts):
        Trainer(**{**QUIET, "logger": logger, **flags}, max_epochs=1, log_every_n_steps=100).fit(
            Counted(log, counts), data)
    syncs = counts["item"] + counts["__bool__"]
    assert syncs == per_step * (STEPS - STEADY_FROM), dict(counts)


class _SyncsAreErrors(Callback):
    """From the steady state's first batch on, a host sync inside a training batch raises (CUDA's own check)."""

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx >= STEADY_FROM:
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        torch.cuda.set_sync_debug_mode("default")


@run_if(min_cuda_gpus=1)
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("log", [False, True], ids=["plain", "self.log every step"])
def test_no_host_sync_in_a_steady_cuda_step(tmp_path: Path, log: bool, precision: str) -> None:
    """16-mixed is left out on purpose: torch's GradScaler.step reads found_inf on the host (docs/precision.md)."""
    data = DataLoader(TensorDataset(torch.randn(8 * STEPS, 8), torch.randn(8 * STEPS, 1)), batch_size=8)
    logger = CSVLogger(str(tmp_path)) if log else False
    trainer = Trainer(**{**QUIET, "logger": logger, "accelerator": "cuda"}, precision=precision, max_epochs=1,
                      log_every_n_steps=100, callbacks=[_SyncsAreErrors()])
    try:
        trainer.fit(Counted(log, collections.Counter()), data)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.global_step == STEPS
