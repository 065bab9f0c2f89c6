"""Every LightningModule hook the Trainer calls is called, with the arguments Lightning's docs give it, and the
properties a step reads mean what they mean in Lightning. One recorded run (fit with validation and a checkpoint,
a resumed fit, validate, test, predict) serves every hook's test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.setup.lightning_names import HOOK, MODULE_NAMES, SUPPORTED

# hook → what each call's arguments must look like (checked on every recorded call)
_EXPECTED_ARGS: dict[str, Any] = {
    "setup": lambda a: a[0] in ("fit", "validate", "test", "predict"),
    "teardown": lambda a: a[0] in ("fit", "validate", "test", "predict"),
    "on_train_batch_start": lambda a: isinstance(a[0], torch.Tensor) and isinstance(a[1], int),
    "on_train_batch_end": lambda a: isinstance(a[0]["loss"], torch.Tensor) and not a[0]["loss"].requires_grad
    and isinstance(a[2], int),
    "on_before_backward": lambda a: isinstance(a[0], torch.Tensor) and a[0].requires_grad,
    "on_before_optimizer_step": lambda a: isinstance(a[0], torch.optim.Optimizer),
    "on_before_zero_grad": lambda a: isinstance(a[0], torch.optim.Optimizer),
    "on_save_checkpoint": lambda a: isinstance(a[0], dict) and "state_dict" in a[0],
    "optimizer_step": lambda a: isinstance(a[0], int) and isinstance(a[1], int)
    and isinstance(a[2], torch.optim.Optimizer) and callable(a[3]),
    "optimizer_zero_grad": lambda a: isinstance(a[0], int) and isinstance(a[1], int)
    and isinstance(a[2], torch.optim.Optimizer),
    "backward": lambda a: isinstance(a[0], torch.Tensor) and a[0].requires_grad,
    "configure_gradient_clipping": lambda a: isinstance(a[0], torch.optim.Optimizer),
    "lr_scheduler_step": lambda a: isinstance(a[0], torch.optim.lr_scheduler.StepLR) and a[1] is None,
    "on_load_checkpoint": lambda a: isinstance(a[0], dict) and "state_dict" in a[0],
    **{f"on_{s}_batch_start": (lambda a: isinstance(a[0], torch.Tensor) and a[1] >= 0)
       for s in ("validation", "test", "predict")},
    **{f"on_{s}_batch_end": (lambda a: isinstance(a[1], torch.Tensor) and a[2] >= 0)
       for s in ("validation", "test", "predict")},
}
_DATA_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")
_STEPS = ("training_step", "validation_step", "test_step", "predict_step", "configure_optimizers")
_MODE_HOOKS = ("on_validation_model_eval", "on_validation_model_train", "on_test_model_eval", "on_test_model_train",
               "on_predict_model_eval", "on_validation_model_zero_grad")
CALLED_HOOKS = sorted(n for n, e in MODULE_NAMES.items() if e.kind == HOOK and e.status == SUPPORTED)


class WithScheduler(BoringModel):
    def configure_optimizers(self) -> Any:  # a scheduler, so that lr_scheduler_step is called too
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]


def _recording(name: str) -> Any:
    base = getattr(WithScheduler, name)

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.setdefault(name, []).append((*args, *kwargs.values()))
        return base(self, *args, **kwargs)

    return hook


Recorder = type("Recorder", (WithScheduler,), {name: _recording(name) for name in CALLED_HOOKS})


def _init(self: Any) -> None:
    BoringModel.__init__(self)
    self.calls = {}


Recorder.__init__ = _init


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[Any, ...]]]:
    folder: Path = tmp_path_factory.mktemp("hooks")
    model = Recorder()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, default_root_dir=folder, **QUIET)
    trainer.fit(model)
    trainer.save_checkpoint(folder / "saved.ckpt")
    resumed = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=2, **QUIET)
    resumed.fit(model, ckpt_path=folder / "saved.ckpt")
    trainer.validate(model)
    trainer.test(model)
    trainer.predict(model)
    return model.calls


# Tested in their own files (order and arguments): test_prepare_data.py, test_model_callbacks.py,
# test_batch_transfer.py; test_run_start_hooks_are_called_too checks that the recorded run called them.
_ELSEWHERE = ("prepare_data", "configure_model", "configure_callbacks", "on_before_batch_transfer",
              "transfer_batch_to_device", "on_after_batch_transfer")


@pytest.mark.parametrize("name", [n for n in CALLED_HOOKS if n not in _ELSEWHERE])
def test_module_hook_is_called_with_lightnings_arguments(name: str, calls: dict[str, list[tuple[Any, ...]]]):
    assert name in calls, f"{name} was never called"
    check = _EXPECTED_ARGS.get(name)
    assert check is None or all(check(args) for args in calls[name])


def test_run_start_hooks_are_called_too(calls: dict[str, list[tuple[Any, ...]]]):
    assert set(_ELSEWHERE) <= set(calls)


def test_steps_and_data_hooks_are_called(calls: dict[str, list[tuple[Any, ...]]]):
    assert set(_STEPS + _DATA_HOOKS + _MODE_HOOKS) <= set(calls)


# --- properties and methods a step reads -----------------------------------------------------------------------
class Reads(BoringModel):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.read: list[tuple[Any, ...]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.read.append((self.current_epoch, self.global_step, self.global_rank, self.local_rank, self.device.type,
                          self.trainer.max_epochs, self.hparams.lr, type(self.lr_schedulers()).__name__))
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]


def test_current_epoch_global_step_ranks_device_trainer_hparams_lr_schedulers():
    model = Reads()
    Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, **QUIET).fit(model)
    assert model.read == [(0, 0, 0, 0, "cpu", 2, 0.1, "StepLR"), (0, 1, 0, 0, "cpu", 2, 0.1, "StepLR"),
                          (1, 2, 0, 0, "cpu", 2, 0.1, "StepLR"), (1, 3, 0, 0, "cpu", 2, 0.1, "StepLR")]


class ClipsManually(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.norms: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self(batch).sum() * 100)
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        self.norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()])))
        opt.step()


def test_automatic_optimization_false_and_clip_gradients():
    model = ClipsManually()
    Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET).fit(model)
    assert model.global_step == 2 and all(n == pytest.approx(0.5, rel=1e-5) for n in model.norms)
