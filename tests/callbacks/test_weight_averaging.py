"""WeightAveraging / EMAWeightAveraging: the average torch's AveragedModel computes over the optimizer steps, used for
validation and kept at the end; Lightning 2.6's checkpoint layout; bit-exact resume; ddp and zero3 on 2 ranks
(the average of a sharded model stays sharded) against one process on the double batch; Lightning as the oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader

from callbacks import Callback, EMAWeightAveraging, ModelCheckpoint, WeightAveraging
from strategies import ZeroStrategy
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything

STEPS = 8


class _Body:
    """The same regression net for our TrainModule and Lightning's LightningModule (a BatchNorm, so buffers too)."""

    def _build(self) -> None:
        self.net = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1))
        self.val_losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.val_losses.append(float(nn.functional.mse_loss(self.net(x), y)))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)


class Net(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self._build()


class RecordSteps(Callback):
    """The module's tensors after every optimizer step (what the average is taken over)."""

    def __init__(self) -> None:
        self.seen: list[list[torch.Tensor]] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append([t.detach().clone() for t in [*pl_module.parameters(), *pl_module.buffers()]])


def _loader(batch_size: int = 8) -> DataLoader:
    return DataLoader(regression_data(n=STEPS * 8), batch_size=batch_size)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_ema_keeps_the_average_of_torchs_averaged_model_over_every_step():
    seed_everything(0)
    model, record = Net(), RecordSteps()
    Trainer(max_steps=STEPS, callbacks=[record, EMAWeightAveraging(decay=0.8)], **QUIET).fit(model, _loader())
    # the same average computed by hand with torch's AveragedModel over the recorded steps
    reference = Net()
    average = AveragedModel(reference, multi_avg_fn=get_ema_multi_avg_fn(0.8), use_buffers=True)
    for tensors in record.seen:
        with torch.no_grad():
            for held, value in zip([*reference.parameters(), *reference.buffers()], tensors, strict=True):
                held.copy_(value)
        average.update_parameters(reference)
    expected = dict(average.module.state_dict())
    assert len(record.seen) == STEPS
    for key, value in _weights(model).items():
        torch.testing.assert_close(value, expected[key].to(value.dtype), rtol=1e-6, atol=1e-7, msg=key)


def test_validation_in_fit_runs_on_the_averaged_weights_and_training_on_the_current_ones():
    class Probe(Callback):
        def __init__(self) -> None:
            self.in_validation: list[torch.Tensor] = []

        def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                      dataloader_idx: int = 0) -> None:
            self.in_validation.append(pl_module.net[0].weight.detach().clone())

    seed_everything(0)
    model, probe, averaging = Net(), Probe(), WeightAveraging()
    flags = {**QUIET, "num_sanity_val_steps": 0, "limit_val_batches": 1}
    Trainer(max_epochs=2, callbacks=[averaging, probe], **flags).fit(model, _loader(), _loader())
    # after the last validation the module holds the trained weights again, then the average at the end
    assert len(probe.in_validation) == 2
    torch.testing.assert_close(probe.in_validation[-1], model.net[0].weight.detach())


def test_should_update_chooses_the_steps_and_epochs():
    class EveryOtherStep(WeightAveraging):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[tuple[int | None, int | None]] = []

        def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
            self.asked.append((step_idx, epoch_idx))
            return step_idx is not None and step_idx % 2 == 1

    seed_everything(0)
    averaging = EveryOtherStep()
    Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[averaging], **QUIET).fit(Net(), _loader())
    # asked with optimizer-step indices (an accumulation window's batches share one), until it says yes
    assert sorted({s for s, _ in averaging.asked if s is not None}) == list(range(STEPS // 2))
    assert int(averaging._average_model.n_averaged) == 2  # after steps 1 and 3
    assert (None, 0) in averaging.asked


def test_ema_starts_and_strides_as_asked():
    ema = EMAWeightAveraging(update_every_n_steps=3, update_starting_at_step=2, update_starting_at_epoch=1)
    assert [s for s in range(10) if ema.should_update(step_idx=s)] == [3, 6, 9]
    assert [e for e in range(3) if ema.should_update(epoch_idx=e)] == [1, 2]


def test_the_checkpoint_holds_the_average_as_state_dict_and_the_trained_weights_beside_it(tmp_path: Path):
    seed_everything(0)
    model = Net()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=STEPS, save_top_k=-1)
    flags = {**QUIET, "enable_checkpointing": True}
    averaging = EMAWeightAveraging(decay=0.5)
    record = RecordSteps()
    Trainer(max_steps=STEPS, callbacks=[record, averaging, saver], **flags).fit(model, _loader())
    checkpoint = torch.load(next(tmp_path.glob("*.ckpt")), weights_only=True)
    trained = dict(zip([k for k, _ in [*model.named_parameters(), *model.named_buffers()]], record.seen[-1],
                       strict=True))
    for key, value in checkpoint["current_model_state"].items():
        assert torch.equal(value, trained[key]), key
    for key, value in checkpoint["state_dict"].items():
        assert torch.equal(value, model.state_dict()[key]), key  # the module ends on the average
    assert int(checkpoint["averaging_state"]["n_averaged"]) == STEPS
    assert torch.equal(Net.load_from_checkpoint(saver.best_model_path).net[0].weight, model.net[0].weight)


def _resume_run(tmp_path: Path, stop: int | None) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = Net()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    flags = {**QUIET, "enable_checkpointing": True, "max_epochs": 2}
    callbacks = [EMAWeightAveraging(decay=0.7, update_starting_at_step=2), saver]
    if stop is None:
        Trainer(callbacks=callbacks, **flags).fit(model, _loader())
    else:
        Trainer(callbacks=callbacks, **flags).fit(model, _loader(), ckpt_path=tmp_path / f"epoch=0-step={stop}.ckpt")
    return _weights(model)


def test_resume_with_ema_is_bit_exact(tmp_path: Path):
    reference = _resume_run(tmp_path, None)
    saved = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert "epoch=0-step=6.ckpt" in saved, saved
    resumed = _resume_run(tmp_path, 6)
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key


def test_a_sharded_checkpoint_folder_is_refused_at_fit_start():
    strategy = ZeroStrategy(stage=3, sharded_checkpoint=True)
    try:
        with pytest.raises(ConfigError, match="sharded_checkpoint=True"):
            Trainer(max_steps=1, strategy=strategy, callbacks=[WeightAveraging()], **QUIET).fit(Net(), _loader())
    finally:  # the strategy keeps its one-rank group for later calls in the same script (strategies/parallel.py)
        torch.distributed.destroy_process_group()


# --- 2 ranks ------------------------------------------------------------------------------------------------------
def _fit(batch_size: int, **flags: Any) -> tuple[dict[str, torch.Tensor], list[bool]]:
    seed_everything(0)
    model = Net()
    model.net[1] = nn.Identity()  # BatchNorm statistics differ between one batch of 16 and two of 8
    averaging = EMAWeightAveraging(decay=0.6)
    sharded: list[bool] = []

    class SeeShards(Callback):
        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            sharded.append(any(hasattr(t, "placements") for t in averaging._average_model.parameters()))

    Trainer(max_steps=STEPS, callbacks=[averaging, SeeShards()], **{**QUIET, **flags}).fit(
        model, _loader(batch_size))
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v.detach().clone()
            for k, v in model.state_dict().items()}, sharded


def _rank(rank: int, strategy: str) -> tuple[dict[str, torch.Tensor], list[bool]]:
    return _fit(4, devices=2, strategy=strategy)


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_two_ranks_average_as_one_process_on_the_double_batch(strategy: str):
    ranks = run_distributed(_rank, strategy)
    single, _ = _fit(8)
    assert ranks[0][1] == ranks[1][1] == [strategy == "zero3"]  # zero3's average is made of DTensor shards
    for key in single:
        assert torch.equal(ranks[0][0][key], ranks[1][0][key]), f"ranks disagree on {key}"
        torch.testing.assert_close(ranks[0][0][key], single[key], rtol=1e-5, atol=1e-6)


# --- Lightning as the oracle -----------------------------------------------------------------------------------------
def test_ema_matches_lightning():
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import EMAWeightAveraging as LightningEMA

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    def run(module: Any, trainer_cls: Any, callback: Any, **flags: Any) -> tuple[dict[str, torch.Tensor], list]:
        trainer_cls(max_epochs=2, callbacks=[callback], num_sanity_val_steps=0, limit_val_batches=2,
                    **flags).fit(module, _loader(), _loader())
        return _weights(module), module.val_losses

    seed_everything(0)
    ours = run(Net(), Trainer, EMAWeightAveraging(decay=0.9, update_starting_at_step=3), **QUIET)
    seed_everything(0)
    theirs = run(Theirs(), lightning.Trainer, LightningEMA(decay=0.9, update_starting_at_step=3), logger=False,
                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                 accelerator="cpu", devices=1)
    assert ours[1] == theirs[1]  # validation saw the same averaged weights
    for key in theirs[0]:
        assert torch.equal(ours[0][key], theirs[0][key]), key


def test_a_weights_only_checkpoint_holds_the_trained_weights_as_in_lightning(tmp_path: Path):
    seed_everything(0)
    model, record = Net(), RecordSteps()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=STEPS, save_weights_only=True)
    flags = {**QUIET, "enable_checkpointing": True}
    Trainer(max_steps=STEPS, callbacks=[record, EMAWeightAveraging(decay=0.5), saver], **flags).fit(model, _loader())
    checkpoint = torch.load(saver.best_model_path, weights_only=True)
    assert "current_model_state" not in checkpoint and "averaging_state" not in checkpoint
    assert torch.equal(checkpoint["state_dict"]["net.0.weight"], record.seen[-1][0])
