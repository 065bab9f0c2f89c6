"""Lightning 2.x's Trainer flags that ported scripts and configs use: `min_steps`, `inference_mode`, `benchmark`,
`sync_batchnorm`, `None` meaning the default, a keyword-only constructor, and `estimated_stepping_batches`, with
Lightning 2.6 run beside ours as the oracle where it is cheap."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, BoringModel, regression_data
from tests.helpers.dist import run_distributed
from tests.helpers.runif import run_if
from trainer import Trainer, TrainModule
from trainer.setup.flags import FLAGS, NONE_MEANS_DEFAULT

LIGHTNING_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                   "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


class _Body:
    """Records what the Trainer offers in configure_optimizers and in the evaluation steps."""

    def _build(self, stop_at: int | None = None) -> None:
        self.net = nn.Linear(32, 1)
        self.stop_at = stop_at
        self.estimated: Any = None
        self.grad_modes: list[tuple[bool, bool]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.stop_at is not None and self.trainer.global_step >= self.stop_at:
            self.trainer.should_stop = True
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.grad_modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))

    def configure_optimizers(self) -> Any:
        self.estimated = self.trainer.estimated_stepping_batches
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Net(_Body, TrainModule):
    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self._build(stop_at)


def _lightning_net(stop_at: int | None = None) -> Any:
    lightning = pytest.importorskip("lightning.pytorch")

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build(stop_at)

    return lightning, Theirs()


def _loader(n: int = 80) -> DataLoader:
    return DataLoader(regression_data(n=n), batch_size=8)


def test_the_constructor_is_keyword_only():
    with pytest.raises(TypeError):
        Trainer("cpu")  # type: ignore[misc]


def test_none_means_the_default_where_lightning_takes_none():
    trainer = Trainer(**{name: None for name in NONE_MEANS_DEFAULT}, accelerator="cpu", devices=1)
    defaults = {flag.name: flag.resolved_default for flag in FLAGS}
    spec = trainer.fit_state.spec
    for name in NONE_MEANS_DEFAULT - {"precision"}:
        assert getattr(spec, name) == defaults[name], name
    assert spec.precision == "32-true" and len(trainer.loggers) == 1  # logger=None: the default logger


@pytest.mark.parametrize(("min_steps", "min_epochs", "stopped_at"), [(7, None, 10), (15, None, 15), (7, 0, 7)])
def test_min_steps_holds_back_a_requested_stop(min_steps: int, min_epochs: int | None, stopped_at: int):
    """Asked to stop from step 1 on: held until min_steps, and, as in Lightning, a min_steps given without
    min_epochs also waits for the end of the first epoch (10 batches)."""
    trainer = Trainer(max_epochs=5, min_steps=min_steps, min_epochs=min_epochs, **QUIET)
    trainer.fit(Net(stop_at=1), _loader())
    assert trainer.global_step == stopped_at


@pytest.mark.parametrize("limits", [{"min_steps": 7}, {"min_steps": 15}, {"min_steps": 7, "min_epochs": 0},
                                    {"max_steps": 30, "min_steps": 3}])
def test_min_steps_matches_lightning(limits: dict[str, int]):
    lightning, theirs = _lightning_net(stop_at=1)
    flags = {"max_epochs": 5, **limits} if "max_steps" not in limits else limits
    ours = Trainer(**flags, **QUIET)
    ours.fit(Net(stop_at=1), _loader())
    trainer = lightning.Trainer(**flags, **LIGHTNING_QUIET)
    trainer.fit(theirs, _loader())
    assert ours.global_step == trainer.global_step


@pytest.mark.parametrize("inference_mode", [True, False])
def test_evaluation_runs_in_inference_mode_or_no_grad(inference_mode: bool):
    model = Net()
    trainer = Trainer(max_epochs=1, limit_val_batches=1, inference_mode=inference_mode, **QUIET)
    trainer.fit(model, _loader(), _loader())
    assert model.grad_modes == [(False, False)] * 2  # in fit: no_grad (the sanity check, then validation)
    trainer.validate(model, _loader(), verbose=False)
    assert model.grad_modes[2:] == [(inference_mode, False)]


def test_inference_mode_matches_lightning():
    lightning, theirs = _lightning_net()
    trainer = lightning.Trainer(max_epochs=1, limit_val_batches=1, **LIGHTNING_QUIET)
    trainer.fit(theirs, _loader(), _loader())
    trainer.validate(theirs, _loader(), verbose=False)
    ours = Net()
    ours_trainer = Trainer(max_epochs=1, limit_val_batches=1, **QUIET)
    ours_trainer.fit(ours, _loader(), _loader())
    ours_trainer.validate(ours, _loader(), verbose=False)
    assert ours.grad_modes == theirs.grad_modes


def _grad_modes_on_a_rank(rank: int) -> list[tuple[bool, bool]]:
    model = Net()
    trainer = Trainer(max_epochs=1, limit_val_batches=1, **{**QUIET, "devices": 2, "strategy": "ddp"})
    trainer.fit(model, _loader(), _loader())
    trainer.validate(model, _loader(), verbose=False)
    return model.grad_modes[2:]


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_under_gloo_evaluation_runs_in_no_grad_as_in_lightning():
    assert run_distributed(_grad_modes_on_a_rank) == [[(False, False)], [(False, False)]]


@pytest.mark.parametrize(("benchmark", "deterministic", "expected"), [(True, False, True), (False, False, False),
                                                                      (None, True, False)])
def test_benchmark_sets_cudnn_benchmark(benchmark: bool | None, deterministic: bool, expected: bool,
                                         monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not expected)  # restored after the test
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    Trainer(max_steps=1, benchmark=benchmark, deterministic=deterministic, **QUIET).fit(BoringModel())
    if deterministic:
        torch.use_deterministic_algorithms(False)
    assert torch.backends.cudnn.benchmark is expected


def test_sync_batchnorm_with_several_cpu_processes_is_refused():
    with pytest.raises(ConfigError, match="sync_batchnorm=True needs CUDA"):
        Trainer(sync_batchnorm=True, accelerator="cpu", devices=2, strategy="ddp")


def _batchnorm_types(rank: int) -> list[str]:
    model = Net()
    model.net = nn.Sequential(nn.Linear(32, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    Trainer(max_steps=1, sync_batchnorm=True, **{**QUIET, "accelerator": "gpu", "devices": 2,
                                                 "strategy": "ddp"}).fit(model, _loader())
    return [type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__]


@run_if(min_cuda_gpus=2)
@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_sync_batchnorm_converts_the_layers_on_gpus():
    assert run_distributed(_batchnorm_types) == [["SyncBatchNorm"], ["SyncBatchNorm"]]


CONFIGS = [
    {"max_epochs": 3, "accumulate_grad_batches": 3},
    {"max_epochs": 2, "limit_train_batches": 0.5},
    {"max_epochs": 4, "max_steps": 5},
    {"max_steps": 7},
]


@pytest.mark.parametrize("flags", CONFIGS)
def test_estimated_stepping_batches_matches_lightning(flags: dict[str, Any]):
    lightning, theirs = _lightning_net()
    lightning.Trainer(**flags, **LIGHTNING_QUIET).fit(theirs, _loader())
    ours = Net()
    Trainer(**flags, **QUIET).fit(ours, _loader())
    assert ours.estimated == theirs.estimated


def test_estimated_stepping_batches_counts_optimizer_steps():
    model = Net()
    trainer = Trainer(max_epochs=3, accumulate_grad_batches=3, **QUIET)
    trainer.fit(model, _loader())
    assert model.estimated == math.ceil(10 / 3) * 3 == trainer.global_step


def _estimate_on_a_rank(rank: int) -> Any:
    model = Net()
    Trainer(max_epochs=2, **{**QUIET, "devices": 2, "strategy": "ddp"}).fit(model, _loader())
    return model.estimated


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_estimated_stepping_batches_is_per_rank_under_ddp():
    assert run_distributed(_estimate_on_a_rank) == [10, 10]  # 80 samples, 40 per rank, 5 batches x 2 epochs


def test_estimated_stepping_batches_before_fit_says_when_it_is_known():
    class Early(Callback):
        pass

    with pytest.raises(Exception, match="configure_optimizers"):
        _ = Trainer(max_epochs=1, callbacks=[Early()], **QUIET).estimated_stepping_batches
