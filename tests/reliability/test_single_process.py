"""The control plane with one process: SIGTERM stops after the batch, saves, exits 143 and resumes exactly;
a NaN loss stops with NonFiniteLossError before the optimizer step. (The 2-rank cases are in test_faults.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, seed_everything
from trainer.ranks.agreement import NonFiniteLossError

FLAGS = {**QUIET, "max_epochs": 2, "num_sanity_val_steps": 0, "limit_val_batches": 0}


class Faulty(BoringModel):
    """Sends itself SIGTERM, or returns a NaN loss, at one global step (once)."""

    def __init__(self, mode: str = "", step: int = -1) -> None:
        super().__init__()
        self.mode, self.step, self.done = mode, step, False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        if self.global_step == self.step and not self.done:
            self.done = True
            if self.mode == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it
            if self.mode == "nan":
                return loss * float("nan")
        return loss


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sigterm_stops_after_the_batch_saves_and_resumes_exactly(tmp_path: Path):
    seed_everything(0)
    reference = Faulty()
    Trainer(default_root_dir=tmp_path / "ref", **FLAGS).fit(reference)

    seed_everything(0)
    stopped = Faulty("sigterm", 5)
    with pytest.raises(SystemExit) as exit_info:
        Trainer(default_root_dir=tmp_path / "run", **FLAGS).fit(stopped)
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handler was not restored"
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 6  # the batch in which the signal arrived was finished first

    seed_everything(0)
    resumed = Faulty()
    trainer = Trainer(default_root_dir=tmp_path / "run", **FLAGS)
    trainer.fit(resumed, ckpt_path="last")
    assert trainer.global_step == 16
    for key, value in _weights(reference).items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_nan_loss_stops_before_the_optimizer_step(tmp_path: Path):
    model = Faulty("nan", 3)
    trainer = Trainer(default_root_dir=tmp_path, terminate_on_nan=True, **FLAGS)
    with pytest.raises(NonFiniteLossError, match=r"the training loss on rank 0 is nan at global step 3"):
        trainer.fit(model)
    assert trainer.global_step == 3
    assert all(torch.isfinite(v).all() for v in _weights(model).values()), "the NaN step reached the weights"


def test_nan_loss_trains_on_without_the_flag(tmp_path: Path):
    model = Faulty("nan", 3)
    trainer = Trainer(default_root_dir=tmp_path, **FLAGS)
    trainer.fit(model)
    assert trainer.global_step == 16
