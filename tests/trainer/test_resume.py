"""Bit-exact resume: stop at batch k, resume from the checkpoint, and get exactly the uninterrupted run.

Shuffled data, dropout, AdamW with a step-interval scheduler; every parameter, optimizer tensor,
scheduler state and the per-batch loss series must be torch.equal (not merely close).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything


class Dropout(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.detach().clone())
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Interrupted(Exception):
    pass


class SaveAndStop(Callback):
    """Saves a checkpoint at a chosen point (after batch k, or in a later hook of that batch) and stops."""

    def __init__(self, batches: int, path: Path, hook: str = "on_train_batch_end") -> None:
        self.batches, self.path, self.hook = batches, path, hook

    def _maybe(self, trainer: Trainer, hook: str) -> None:
        if hook == self.hook and trainer.total_batches == self.batches and not trainer.sanity_checking:
            trainer.save_checkpoint(self.path)
            raise Interrupted

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):  # noqa: ANN001, ANN201
        self._maybe(trainer, "on_train_batch_end")

    def on_validation_end(self, trainer, module):  # noqa: ANN001, ANN201
        self._maybe(trainer, "on_validation_end")

    def on_train_epoch_end(self, trainer, module):  # noqa: ANN001, ANN201
        self._maybe(trainer, "on_train_epoch_end")


def _loader(workers: int) -> DataLoader:
    return DataLoader(regression_data(n=80), batch_size=8, shuffle=True, num_workers=workers,
                      persistent_workers=False)


def _run(callbacks: list[Callback], ckpt: Path | None = None, workers: int = 0, seed: int = 0,
         **flags: Any) -> tuple[Dropout, Trainer]:
    seed_everything(seed)
    model = Dropout()
    trainer = Trainer(max_epochs=3, callbacks=callbacks, **{**QUIET, **flags})
    try:
        trainer.fit(model, _loader(workers), DataLoader(regression_data(n=24, seed=1), batch_size=8),
                    ckpt_path=ckpt)
    except Interrupted:
        pass
    return model, trainer


def _assert_same_state(a: tuple[Dropout, Trainer], b: tuple[Dropout, Trainer]) -> None:
    (ma, ta), (mb, tb) = a, b
    for key, value in ma.state_dict().items():
        assert torch.equal(value, mb.state_dict()[key]), key
    sa, sb = ta.optimizers[0].state_dict(), tb.optimizers[0].state_dict()
    for param_id, state in sa["state"].items():
        for name, tensor in state.items():
            assert torch.equal(tensor, sb["state"][param_id][name]), (param_id, name)
    assert ta.lr_scheduler_configs[0].scheduler.state_dict() == tb.lr_scheduler_configs[0].scheduler.state_dict()
    assert (ta.global_step, ta.current_epoch) == (tb.global_step, tb.current_epoch)
    for key in ("train_loss_epoch", "val_loss"):
        assert torch.equal(ta.callback_metrics[key], tb.callback_metrics[key]), key


def _interrupt_and_resume(tmp_path: Path, stops: list[tuple[int, str]], workers: int = 0, **flags: Any) -> None:
    reference = _run([], workers=workers, **flags)
    losses: list[torch.Tensor] = []
    ckpt = None
    for i, (batches, hook) in enumerate(stops):
        path = tmp_path / f"stop{i}.ckpt"
        seed = 0 if ckpt is None else 100 + i  # a resumed run must not depend on the seed it starts with
        model, _ = _run([SaveAndStop(batches, path, hook)], ckpt=ckpt, workers=workers, seed=seed, **flags)
        losses += model.losses
        ckpt = path
    resumed = _run([], ckpt=ckpt, workers=workers, seed=999, **flags)
    losses += resumed[0].losses
    assert len(losses) == len(reference[0].losses) == 30
    assert all(torch.equal(a, b) for a, b in zip(losses, reference[0].losses, strict=True))
    _assert_same_state(reference, resumed)


@pytest.mark.parametrize(
    ("stops", "flags"),
    [
        ([(14, "on_train_batch_end")], {}),  # mid-epoch
        ([(10, "on_train_epoch_end")], {}),  # at an epoch end
        ([(10, "on_train_batch_end")], {}),  # after the last batch, before the epoch-end validation
        ([(13, "on_train_batch_end")], {"accumulate_grad_batches": 3}),  # inside an accumulation window
        ([(15, "on_validation_end")], {"val_check_interval": 0.5}),  # right after a mid-epoch validation
        ([(15, "on_train_batch_end")], {"val_check_interval": 0.5}),  # just before it: it runs on resume
        ([(7, "on_train_batch_end"), (18, "on_train_batch_end")], {}),  # resumed twice in a row
    ],
    ids=["mid_epoch", "epoch_end", "before_epoch_validation", "accumulation_window", "after_mid_validation",
         "before_mid_validation", "twice"],
)
def test_resume_is_bit_exact(tmp_path: Path, stops: list[tuple[int, str]], flags: dict):
    _interrupt_and_resume(tmp_path, stops, **flags)


@pytest.mark.timeout(120)
def test_resume_is_bit_exact_with_worker_processes(tmp_path: Path):
    _interrupt_and_resume(tmp_path, [(14, "on_train_batch_end")], workers=2)


class SaveEveryBatch(Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):  # noqa: ANN001, ANN201
        trainer.save_checkpoint(self.path)


def test_saving_every_step_has_no_side_effect(tmp_path: Path):
    reference = _run([])
    saving = _run([SaveEveryBatch(tmp_path / "every.ckpt")])
    assert all(torch.equal(a, b) for a, b in zip(reference[0].losses, saving[0].losses, strict=True))
    _assert_same_state(reference, saving)


def _ddp_rank(rank: int, tmp: str, stop: int | None, resume: bool) -> tuple[list[torch.Tensor], dict]:
    callbacks = [SaveAndStop(stop, Path(tmp) / "ddp.ckpt")] if stop else []
    model, trainer = _run(callbacks, ckpt=Path(tmp) / "ddp.ckpt" if resume else None, seed=5 if resume else 0,
                          devices=2, strategy="ddp")
    return model.losses, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_resume_is_bit_exact_under_ddp(tmp_path: Path):
    reference = run_distributed(_ddp_rank, str(tmp_path), None, False)
    first = run_distributed(_ddp_rank, str(tmp_path), 8, False)  # 5 batches per rank per epoch: mid-epoch 2
    second = run_distributed(_ddp_rank, str(tmp_path), None, True)
    for rank in range(2):
        losses = first[rank][0] + second[rank][0]
        assert len(losses) == len(reference[rank][0]) == 15
        assert all(torch.equal(a, b) for a, b in zip(losses, reference[rank][0], strict=True))
        for key, value in reference[rank][1].items():
            assert torch.equal(value, second[rank][1][key]), (rank, key)
