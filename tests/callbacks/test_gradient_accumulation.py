"""GradientAccumulationScheduler: Lightning as the oracle (global_step after every batch, the batches each epoch
steps after, final weights), Lightning's argument checks and conflicts, and a resume inside an accumulation window
of a later epoch that ends bit-exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback, GradientAccumulationScheduler
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule, seed_everything

LIGHTNING_FLAGS = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                   "enable_model_summary": False, "accelerator": "cpu", "devices": 1}
SCHEDULE = {1: 2, 3: 3}


class _Body:
    def _build(self) -> None:
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)


class Net(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self._build()


class _Plain(_Body):
    def __init__(self) -> None:
        super().__init__()
        self._build()


class _Manual(_Plain):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        optimizer.step()


class Steps(Callback):
    """(epoch, batch_idx, global_step) after every batch, and the batches the optimizer stepped after."""

    def __init__(self) -> None:
        self.after_batch: list[tuple[int, int, int]] = []
        self.factors: list[int] = []

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.factors.append(trainer.accumulate_grad_batches)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.after_batch.append((trainer.current_epoch, batch_idx, trainer.global_step))


def _loader() -> DataLoader:
    return DataLoader(regression_data(n=56), batch_size=8)  # 7 batches: the schedule's windows end short


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_matches_lightning():
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import GradientAccumulationScheduler as Theirs

    class TheirNet(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    seed_everything(0)
    ours, our_steps = Net(), Steps()
    Trainer(max_epochs=5, callbacks=[GradientAccumulationScheduler(dict(SCHEDULE)), our_steps],
            **QUIET).fit(ours, _loader())
    seed_everything(0)
    theirs, their_steps = TheirNet(), Steps()
    lightning.Trainer(max_epochs=5, callbacks=[Theirs(dict(SCHEDULE)), their_steps],
                      **LIGHTNING_FLAGS).fit(theirs, _loader())
    assert our_steps.factors == their_steps.factors == [1, 2, 2, 3, 3]
    assert our_steps.after_batch == their_steps.after_batch
    expected = _weights(theirs)
    for key, value in _weights(ours).items():
        assert torch.equal(value, expected[key]), key


def test_the_factor_follows_the_schedule():
    accumulator = GradientAccumulationScheduler({4: 2, 8: 4})
    assert accumulator.scheduling == {0: 1, 4: 2, 8: 4}
    assert [accumulator.get_accumulate_grad_batches(e) for e in (0, 3, 4, 7, 8, 100)] == [1, 1, 2, 2, 4, 4]


@pytest.mark.parametrize(("scheduling", "error"), [
    ({}, TypeError),
    ({-1: 2}, MisconfigurationError),
    ({1.0: 2}, MisconfigurationError),
    ({1: 0}, MisconfigurationError),
    ({1: 2.5}, MisconfigurationError),
])
def test_bad_schedules_are_refused(scheduling: dict[Any, Any], error: type[Exception]):
    with pytest.raises(error):
        GradientAccumulationScheduler(scheduling)


def _lightning_fit(module_class: type, error: type[Exception], **flags: Any) -> None:
    """Lightning raises `error` for the same run."""
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import GradientAccumulationScheduler as Theirs

    class TheirNet(module_class, lightning.LightningModule):  # type: ignore[misc, valid-type]
        pass

    with pytest.raises(error):
        lightning.Trainer(max_epochs=1, callbacks=[Theirs({0: 2})], **{**LIGHTNING_FLAGS, **flags}).fit(
            TheirNet(), _loader())


def test_the_trainer_flag_conflicts_with_the_callback():
    with pytest.raises(ValueError, match="accumulate_grad_batches=2"):
        Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({1: 2})],
                **QUIET).fit(Net(), _loader())
    _lightning_fit(_Plain, ValueError, accumulate_grad_batches=2)


def test_manual_optimization_is_refused_as_in_lightning():
    class Manual(_Manual, TrainModule):
        pass

    with pytest.raises(RuntimeError, match="automatic optimization"):
        Trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})], **QUIET).fit(Manual(), _loader())
    _lightning_fit(_Manual, RuntimeError)


def test_the_estimate_of_stepping_batches_reads_the_current_factor():
    class Read(Callback):
        estimates: list[int | float] = []

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.estimates.append(trainer.estimated_stepping_batches)

    read = Read()
    Trainer(max_epochs=2, callbacks=[GradientAccumulationScheduler({1: 2}), read], **QUIET).fit(Net(), _loader())
    assert read.estimates == [14, 8]  # 7 batches: ceil(7 / factor) * 2 epochs, as Lightning computes it


# --- resume ---------------------------------------------------------------------------------------------------------
class SaveAt(Callback):
    """Save a checkpoint after one batch (inside an accumulation window of factor 3: gradients pending)."""

    def __init__(self, path: Path, epoch: int, batch_idx: int) -> None:
        self.path, self.epoch, self.batch_idx = path, epoch, batch_idx

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch_idx):
            trainer.save_checkpoint(self.path)


def _run(ckpt: Path, resume: bool) -> tuple[dict[str, torch.Tensor], list[tuple[int, int, int]], list[int]]:
    seed_everything(0)
    model, steps = Net(), Steps()
    callbacks = [GradientAccumulationScheduler(dict(SCHEDULE)), steps]
    if not resume:
        callbacks.append(SaveAt(ckpt, epoch=3, batch_idx=3))
    Trainer(max_epochs=5, callbacks=callbacks, **QUIET).fit(model, _loader(), ckpt_path=ckpt if resume else None)
    return _weights(model), steps.after_batch, steps.factors


def test_resume_inside_a_window_of_a_later_epoch_is_bit_exact(tmp_path: Path):
    ckpt = tmp_path / "mid.ckpt"
    reference, reference_steps, _ = _run(ckpt, resume=False)
    resumed, resumed_steps, factors = _run(ckpt, resume=True)
    assert factors == [3, 3]  # epoch 3 (resumed after its batch 3) and epoch 4
    assert resumed_steps == reference_steps[-len(resumed_steps):] and resumed_steps[0] == (3, 4, 16)
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key
