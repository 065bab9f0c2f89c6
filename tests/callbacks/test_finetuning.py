"""BaseFinetuning / BackboneFinetuning: frozen before configure_optimizers, unfrozen into a new param group at the
chosen epoch with Lightning's learning-rate schedule; bit-exact resume after the unfreeze; under ddp and zero1 the
unfrozen layers' gradients are averaged across ranks (the strategy wraps again), so 2 ranks match one process on
the double batch; Lightning as the oracle on one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import BackboneFinetuning, BaseFinetuning, Callback, ModelCheckpoint
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything

BATCHES = 4


class _Body:
    def _build(self) -> None:
        self.backbone = nn.Sequential(nn.Linear(32, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.backbone(x)), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1, momentum=0.9)


class Net(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self._build()


class RecordLrs(Callback):
    def __init__(self) -> None:
        self.lrs: list[list[float]] = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.lrs.append([group["lr"] for group in trainer.optimizers[0].param_groups])


def _loader(batch_size: int = 8) -> DataLoader:
    return DataLoader(regression_data(n=BATCHES * 8), batch_size=batch_size)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_the_backbone_trains_from_the_chosen_epoch_with_lightnings_learning_rates():
    seed_everything(0)
    model, record = Net(), RecordLrs()
    start = _weights(model)["backbone.0.weight"]
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.5)
    frozen_after_epoch_0: list[bool] = []

    class Probe(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == 0:
                frozen_after_epoch_0.append(torch.equal(pl_module.backbone[0].weight, start))

    Trainer(max_epochs=4, callbacks=[finetuning, record, Probe()], **QUIET).fit(model, _loader())
    assert frozen_after_epoch_0 == [True]
    assert not torch.equal(model.backbone[0].weight, start)
    # epoch 1: 0.1 * 0.1; then x1.5 per epoch (capped at the head's 0.1 by should_align)
    expected = [[0.1], [0.1, 0.01], [0.1, 0.015], [0.1, 0.0225]]
    assert [[round(lr, 10) for lr in lrs] for lrs in record.lrs] == expected


def test_a_backbone_is_required():
    class NoBackbone(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(32, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0]).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(ConfigError, match="backbone"):
        Trainer(max_epochs=1, callbacks=[BackboneFinetuning()], **QUIET).fit(NoBackbone(), _loader())


def test_parameters_already_in_the_optimizer_are_skipped_with_a_warning():
    layer = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="The provided params to be frozen already exist within another group"):
        BaseFinetuning.unfreeze_and_add_param_group(layer, optimizer)
    assert len(optimizer.param_groups) == 1


def test_freeze_keeps_batchnorm_trainable_when_asked():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    BaseFinetuning.freeze(model, train_bn=True)
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]
    BaseFinetuning.freeze(model, train_bn=False)
    assert not any(p.requires_grad for p in model.parameters()) and not model[1].track_running_stats


def _resume_run(tmp_path: Path) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = Net()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=6, save_top_k=-1)
    callbacks = [BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.5), saver]
    flags = {**QUIET, "enable_checkpointing": True, "max_epochs": 4}
    Trainer(callbacks=callbacks, **flags).fit(model, _loader())
    return _weights(model)


def test_resume_after_the_unfreeze_is_bit_exact(tmp_path: Path):
    reference = _resume_run(tmp_path)
    assert (tmp_path / "epoch=1-step=6.ckpt").exists()  # mid-epoch 1, after the backbone joined the optimizer
    resumed = _resume_run_from(tmp_path)
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key


def _resume_run_from(tmp_path: Path) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = Net()
    callbacks = [BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.5)]
    Trainer(callbacks=callbacks, **{**QUIET, "max_epochs": 4}).fit(model, _loader(),
                                                                      ckpt_path=tmp_path / "epoch=1-step=6.ckpt")
    return _weights(model)


# --- 2 ranks ------------------------------------------------------------------------------------------------------
def _fit(batch_size: int, **flags: Any) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = Net()
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_lr=0.05)
    Trainer(max_epochs=3, callbacks=[finetuning], **{**QUIET, **flags}).fit(model, _loader(batch_size))
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v.detach().clone()
            for k, v in model.state_dict().items()}


def _rank(rank: int, strategy: str) -> dict[str, torch.Tensor]:
    return _fit(4, devices=2, strategy=strategy)


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero3"])
def test_two_ranks_fine_tune_as_one_process_on_the_double_batch(strategy: str):
    ranks = run_distributed(_rank, strategy)
    single = _fit(8)
    for key in single:
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks disagree on {key}"
        torch.testing.assert_close(ranks[0][key], single[key], rtol=1e-5, atol=1e-6)


# --- Lightning as the oracle -----------------------------------------------------------------------------------------
def test_backbone_finetuning_matches_lightning():
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import BackboneFinetuning as LightningBackboneFinetuning

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    def callback(cls: Any) -> Any:
        return cls(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.5, backbone_initial_ratio_lr=0.2)

    seed_everything(0)
    ours = Net()
    Trainer(max_epochs=4, callbacks=[callback(BackboneFinetuning)], **QUIET).fit(ours, _loader())
    seed_everything(0)
    theirs = Theirs()
    lightning.Trainer(max_epochs=4, callbacks=[callback(LightningBackboneFinetuning)], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", devices=1).fit(theirs, _loader())
    for key, value in _weights(theirs).items():
        assert torch.equal(_weights(ours)[key], value), key
