"""StochasticWeightAveraging: Lightning as the oracle (final weights, BatchNorm statistics included, and the LR of
every epoch), its constructor checks, bit-exact resume from inside the SWA phase, and 2 ddp ranks that agree."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback, ModelCheckpoint, StochasticWeightAveraging
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything

LIGHTNING_FLAGS = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                   "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


class _Body:
    """The same net for our TrainModule and Lightning's LightningModule; `norm` adds a BatchNorm layer."""

    def _build(self, norm: bool, scheduler: bool) -> None:
        self.net = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16) if norm else nn.Identity(), nn.Tanh(),
                                 nn.Linear(16, 1))
        self.with_scheduler = scheduler

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        if not self.with_scheduler:
            return optimizer
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]


class Net(_Body, TrainModule):
    def __init__(self, norm: bool = True, scheduler: bool = True) -> None:
        super().__init__()
        self._build(norm, scheduler)


class RecordLR(Callback):
    """The learning rate each epoch trains with, and the parameters at the start of each epoch's first batch."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.params: list[dict[str, torch.Tensor]] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
            self.params.append({k: v.detach().clone() for k, v in pl_module.named_parameters()})


def _loader() -> DataLoader:
    return DataLoader(regression_data(n=32), batch_size=8)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _lightning_net(norm: bool, scheduler: bool) -> Any:
    lightning = pytest.importorskip("lightning.pytorch")

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build(norm, scheduler)

    return Theirs()


@pytest.mark.parametrize(("norm", "scheduler", "swa", "strategy"), [
    (True, True, {"swa_epoch_start": 2, "annealing_epochs": 2}, "cos"),
    (False, True, {"swa_epoch_start": 0.5, "annealing_epochs": 1}, "linear"),
    (True, False, {"swa_epoch_start": 3, "swa_lrs": [0.02]}, "cos"),
])
def test_matches_lightning(norm: bool, scheduler: bool, swa: dict[str, Any], strategy: str):
    pytest.importorskip("lightning.pytorch")
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import StochasticWeightAveraging as TheirSWA

    kwargs = {"swa_lrs": 0.05, "annealing_strategy": strategy, **swa}
    seed_everything(0)
    ours, our_lrs = Net(norm, scheduler), RecordLR()
    trainer = Trainer(max_epochs=5, callbacks=[our_lrs, StochasticWeightAveraging(**kwargs)], **QUIET)
    trainer.fit(ours, _loader())
    seed_everything(0)
    theirs, their_lrs = _lightning_net(norm, scheduler), RecordLR()
    pl.Trainer(max_epochs=5, callbacks=[their_lrs, TheirSWA(**kwargs)], **LIGHTNING_FLAGS).fit(theirs, _loader())
    # Lightning runs its BatchNorm pass as a 6th epoch; ours runs it in on_train_end (docs/from-lightning.md)
    assert our_lrs.lrs == their_lrs.lrs[:5] and len(their_lrs.lrs) == (6 if norm else 5)
    assert trainer.current_epoch == 5
    expected = _weights(theirs)
    if norm:  # that epoch ends with an optimizer step on the last real step's gradients (its zero_grad is skipped),
        # which moves Lightning's average after the statistics were taken; ours keeps the average as it was
        expected.update(their_lrs.params[5])
    for key, value in _weights(ours).items():
        assert torch.equal(value, expected[key]), key


def test_the_average_is_the_mean_of_the_epoch_starts_weights():
    class Snapshots(Callback):
        def __init__(self) -> None:
            self.seen: list[list[torch.Tensor]] = []

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.seen.append([p.detach().clone() for p in pl_module.parameters()])

    seed_everything(0)
    model, snapshots = Net(norm=False), Snapshots()
    Trainer(max_epochs=4, callbacks=[snapshots, StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2)],
            **QUIET).fit(model, _loader())
    # swa_epoch_start=2 is epoch 1 (0-based): the starts of epochs 1, 2, 3 (the weights after epochs 0, 1, 2)
    for param, *seen in zip(model.parameters(), *snapshots.seen[1:], strict=True):
        torch.testing.assert_close(param.detach(), torch.stack(seen).mean(0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"swa_lrs": 0.1, "swa_epoch_start": 0}, "swa_epoch_start"),
    ({"swa_lrs": 0.1, "swa_epoch_start": 1.5}, "swa_epoch_start"),
    ({"swa_lrs": -0.1}, "swa_lrs"),
    ({"swa_lrs": 1}, "swa_lrs"),
    ({"swa_lrs": [0.1, 0]}, "swa_lrs"),
    ({"swa_lrs": 0.1, "avg_fn": 3}, "avg_fn"),
    ({"swa_lrs": 0.1, "device": 0}, "device"),
    ({"swa_lrs": 0.1, "annealing_strategy": "step"}, "annealing_strategy"),
])
def test_bad_arguments_are_refused(kwargs: dict[str, Any], match: str):
    with pytest.raises(MisconfigurationError, match=match):
        StochasticWeightAveraging(**kwargs)


def test_a_fraction_needs_max_epochs():
    with pytest.raises(MisconfigurationError, match="max_epochs"):
        Trainer(max_epochs=-1, max_steps=4, callbacks=[StochasticWeightAveraging(swa_lrs=0.1)],
                **QUIET).fit(Net(), _loader())


def test_two_optimizers_are_refused():
    class Two(Net):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            return None

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.net.parameters(), lr=0.1), torch.optim.SGD(self.net.parameters(), lr=0.1)]

    with pytest.raises(MisconfigurationError, match="1 optimizer"):
        Trainer(max_epochs=2, callbacks=[StochasticWeightAveraging(swa_lrs=0.1)], **QUIET).fit(Two(), _loader())


def test_sharded_parameters_are_refused():
    from strategies import ZeroStrategy

    try:
        with pytest.raises(MisconfigurationError, match="zero3"):
            Trainer(max_epochs=2, strategy=ZeroStrategy(stage=3), callbacks=[StochasticWeightAveraging(swa_lrs=0.1)],
                    **QUIET).fit(Net(), _loader())
    finally:  # the strategy keeps its one-rank group for later calls in the same script (strategies/parallel.py)
        torch.distributed.destroy_process_group()


# --- resume ---------------------------------------------------------------------------------------------------------
def _resume_run(tmp_path: Path, resume_from: str | None) -> tuple[dict[str, torch.Tensor], list[float]]:
    seed_everything(0)
    model, lrs = Net(), RecordLR()
    saver = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{step}", save_top_k=-1, every_n_train_steps=2)
    at_epoch_end = ModelCheckpoint(dirpath=tmp_path / "ends", filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    callbacks = [lrs, StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=3), saver,
                 at_epoch_end]
    trainer = Trainer(max_epochs=5, callbacks=callbacks, **{**QUIET, "enable_checkpointing": True})
    trainer.fit(model, _loader(), ckpt_path=None if resume_from is None else tmp_path / resume_from)
    return _weights(model), lrs.lrs


# inside an SWA epoch, after the last batch of the first SWA epoch, before SWA, and saved in on_train_epoch_end
# (the restore finishes that epoch: the SWALR, or before SWA the module's scheduler, steps once) before and in SWA
@pytest.mark.parametrize("resume_from", ["epoch=2-step=10.ckpt", "epoch=1-step=8.ckpt", "epoch=0-step=2.ckpt",
                                         "ends/epoch=0.ckpt", "ends/epoch=2.ckpt"])
def test_resume_is_bit_exact(tmp_path: Path, resume_from: str):
    reference, reference_lrs = _resume_run(tmp_path, None)
    assert (tmp_path / resume_from).exists(), sorted(p.name for p in tmp_path.iterdir())
    resumed, resumed_lrs = _resume_run(tmp_path, resume_from)
    assert resumed_lrs == reference_lrs[-len(resumed_lrs):]
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key


# --- 2 ranks ---------------------------------------------------------------------------------------------------------
def _rank(rank: int, strategy: str) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = Net()
    Trainer(max_epochs=3, callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2)],
            **{**QUIET, "devices": 2, "strategy": strategy}).fit(model, _loader())
    return _weights(model)


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_two_ranks_train_and_agree(strategy: str):
    ranks = run_distributed(_rank, strategy)
    seed_everything(0)
    initial = _weights(Net())
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks disagree on {key}"
    assert not torch.equal(ranks[0]["net.0.weight"], initial["net.0.weight"])
    assert float(ranks[0]["net.1.num_batches_tracked"]) == 2  # the BatchNorm pass: 2 batches per rank


# --- checkpoints across the two libraries ----------------------------------------------------------------------------
def _lightning_checkpoints(tmp_path: Path, norm: bool) -> list[Path]:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint as TheirCheckpoint
    from lightning.pytorch.callbacks import StochasticWeightAveraging as TheirSWA

    seed_everything(0)
    theirs = _lightning_net(norm, True)
    saver = TheirCheckpoint(dirpath=tmp_path / "lightning", filename="{epoch}", save_top_k=-1)
    flags = {**LIGHTNING_FLAGS, "enable_checkpointing": True}
    pl.Trainer(max_epochs=4, callbacks=[TheirSWA(swa_lrs=0.05, swa_epoch_start=2), saver], **flags).fit(
        theirs, _loader())
    return sorted((tmp_path / "lightning").glob("epoch=*.ckpt"))


def test_the_checkpointed_state_is_lightnings(tmp_path: Path):
    pytest.importorskip("lightning.pytorch")
    theirs = _lightning_checkpoints(tmp_path, norm=True)
    seed_everything(0)
    saver = ModelCheckpoint(dirpath=tmp_path / "ours", filename="{epoch}", save_top_k=-1)
    Trainer(max_epochs=4, callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2), saver],
            **{**QUIET, "enable_checkpointing": True}).fit(Net(), _loader())
    ours = torch.load(tmp_path / "ours" / "epoch=2.ckpt", weights_only=True)["callbacks"]["StochasticWeightAveraging"]
    their = torch.load(theirs[2], weights_only=False)["callbacks"]["StochasticWeightAveraging"]
    assert ours.keys() == their.keys()
    # both step epoch schedulers after the epoch's last batch, before on_train_epoch_end, where the checkpoint is saved
    assert (ours["n_averaged"], ours["latest_update_epoch"]) == (their["n_averaged"], their["latest_update_epoch"])
    assert ours["scheduler_state"]["last_epoch"] == their["scheduler_state"]["last_epoch"]
    assert ours["average_model_state"].keys() == their["average_model_state"].keys()
    for name, _ in Net().named_parameters():  # only parameters are averaged (the buffers are never transferred)
        assert torch.equal(ours["average_model_state"][name], their["average_model_state"][name]), name



def test_what_the_batch_norm_pass_logs_goes_nowhere():
    class Logs(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

    class LastEpoch(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.metrics = dict(trainer.callback_metrics)

    seed_everything(0)
    last = LastEpoch()
    trainer = Trainer(max_epochs=3, callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2), last],
                      **QUIET)
    model = Logs()
    trainer.fit(model, _loader())
    assert float(model.net[1].num_batches_tracked) == 4  # the pass ran
    assert trainer.callback_metrics == last.metrics


def test_lightnings_public_helpers_give_lightnings_numbers():
    pl = pytest.importorskip("lightning.pytorch")
    theirs = pl.callbacks.StochasticWeightAveraging
    torch.manual_seed(0)
    average, model = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    ours_avg, their_avg = copy.deepcopy(average), copy.deepcopy(average)
    ours_n, their_n = torch.tensor(0), torch.tensor(0)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        StochasticWeightAveraging.update_parameters(ours_avg, model, ours_n, StochasticWeightAveraging.avg_fn)
        theirs.update_parameters(their_avg, model, their_n, theirs.avg_fn)
    assert int(ours_n) == int(their_n) == 3
    assert all(torch.equal(a, b) for a, b in zip(ours_avg.parameters(), their_avg.parameters(), strict=True))
    StochasticWeightAveraging.transfer_weights(ours_avg, model)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ours_avg.parameters(), strict=True))
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3, momentum=0.3))
    swa = StochasticWeightAveraging(swa_lrs=0.1)
    swa.reset_batch_norm_and_save_state(net)
    assert net[1].momentum is None and torch.equal(net[1].running_var, torch.ones(3))
    swa.reset_momenta()
    assert net[1].momentum == 0.3
