"""What a run does around the loop, as in Lightning (issue 40): the loaders the Trainer exposes, evaluation hooks
without gradients, the module's own train/eval mode, `model.<hook> = None`, monitoring callbacks after the module's
`on_train_epoch_end`, a validation before a requested stop, and the schedulers manual optimization leaves alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import EarlyStopping, ModelCheckpoint
from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import Trainer
from trainer.exceptions import MisconfigurationError


def _loader(n: int = 16, batch_size: int = 4) -> DataLoader:
    return DataLoader(RandomDataset(32, n), batch_size=batch_size)


def test_the_trainer_exposes_the_loaders_of_each_stage_in_the_shape_given():
    class Model(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            return super().validation_step(batch, batch_idx)

    trainer = Trainer(max_epochs=1, **QUIET)
    assert trainer.train_dataloader is None and trainer.val_dataloaders is None  # nothing requested yet
    train, val = _loader(), [_loader(), _loader(8)]
    trainer.fit(Model(), train, val)
    # the training loader is re-built with a replayable sampler (bit-exact resume), over the same data
    assert trainer.train_dataloader.dataset is train.dataset and trainer.train_dataloader.batch_size == 4
    assert isinstance(trainer.val_dataloaders, list) and trainer.val_dataloaders == val
    assert trainer.num_val_batches == [4, 2]
    tests = {"a": _loader(), "b": _loader(4)}
    Model.test_step = lambda self, batch, batch_idx, dataloader_idx=0: None  # type: ignore[method-assign]
    trainer.test(Model(), tests, verbose=False)
    assert trainer.test_dataloaders == tests
    predict = _loader()
    trainer.predict(BoringModel(), predict)
    assert trainer.predict_dataloaders is not None and trainer.num_predict_batches == [4]


def test_estimated_stepping_batches_in_configure_optimizers_requests_the_training_loader_once():
    requests = []

    class Model(BoringModel):
        def train_dataloader(self) -> DataLoader:
            requests.append(self.trainer.current_epoch)
            return _loader(24)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            total = self.trainer.estimated_stepping_batches
            return [opt], [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)]

    trainer = Trainer(max_epochs=2, limit_val_batches=0, **QUIET)
    trainer.fit(Model())
    assert requests == [0] and trainer.global_step == 12


def test_evaluation_hooks_run_without_gradients():
    seen = {}

    class Model(BoringModel):
        def on_validation_start(self) -> None:
            seen[("validation", self.trainer.state.fn.value)] = (torch.is_grad_enabled(),
                                                                 torch.is_inference_mode_enabled())

        def on_test_epoch_start(self) -> None:
            seen[("test", "test")] = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())

        def on_predict_start(self) -> None:
            seen[("predict", "predict")] = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())

    model, trainer = Model(), Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, **QUIET)
    trainer.fit(model)
    trainer.validate(model, verbose=False)
    trainer.test(model, verbose=False)
    trainer.predict(model)
    assert seen == {("validation", "fit"): (False, False),  # no_grad inside fit: training follows
                    ("validation", "validate"): (False, True), ("test", "test"): (False, True),
                    ("predict", "predict"): (False, True)}


def test_training_leaves_a_submodule_in_eval_mode_as_it_is_and_says_so():
    modes = []

    class Model(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            modes.append(self.layer.training)
            return super().training_step(batch, batch_idx)

    model = Model()
    model.layer.eval()
    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, **QUIET)
    with pytest.warns(UserWarning, match="eval mode as training starts"):
        trainer.fit(model)
    assert modes == [False] * 4 and not model.layer.training and model.training


def test_a_step_set_to_none_switches_its_loop_off():
    model = BoringModel()
    model.validation_step = None
    requested = []
    model.val_dataloader = lambda: requested.append("val") or _loader()  # type: ignore[method-assign]
    trainer = Trainer(max_epochs=1, limit_train_batches=2, **QUIET)
    trainer.fit(model)
    assert requested == [] and trainer.num_val_batches == [] and trainer.global_step == 2


def test_a_hook_set_to_none_is_not_called():
    model = BoringModel()
    model.on_train_epoch_start = None
    model.on_validation_model_eval = None  # then the module stays in train mode while validating
    modes = []
    model.on_validation_start = lambda: modes.append(model.training)  # type: ignore[method-assign]
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0, **QUIET).fit(model)
    assert modes == [True]


class _LogsAtEpochEnd(BoringModel):
    """Logs the monitored value in on_train_epoch_end only."""

    def on_train_epoch_end(self) -> None:
        self.log("epoch_score", float(-self.current_epoch))


def test_monitoring_callbacks_see_a_value_the_module_logs_in_on_train_epoch_end(tmp_path: Path):
    checkpoint = ModelCheckpoint(tmp_path, monitor="epoch_score", mode="max", filename="{epoch}")
    stopper = EarlyStopping("epoch_score", mode="max", patience=1)
    trainer = Trainer(max_epochs=5, limit_train_batches=1, limit_val_batches=1, callbacks=[checkpoint, stopper],
                      **{**QUIET, "enable_checkpointing": True})
    trainer.fit(_LogsAtEpochEnd())
    assert Path(checkpoint.best_model_path).name == "epoch=0.ckpt"
    assert stopper.stopped_epoch == 1 and trainer.current_epoch == 2


def test_no_checkpoint_is_saved_outside_fit(tmp_path: Path):
    checkpoint = ModelCheckpoint(tmp_path)
    Trainer(callbacks=[checkpoint], **{**QUIET, "enable_checkpointing": True}).validate(BoringModel(), verbose=False)
    assert list(tmp_path.iterdir()) == []


def test_the_batch_that_sets_should_stop_is_followed_by_a_validation():
    calls = []

    class Model(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 2:
                self.trainer.should_stop = True
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            calls.append(self.trainer.global_step)
            return super().validation_step(batch, batch_idx)

    trainer = Trainer(max_epochs=1, limit_train_batches=6, limit_val_batches=1, num_sanity_val_steps=0, **QUIET)
    trainer.fit(Model())
    assert calls == [3] and trainer.global_step == 3 and trainer.current_epoch == 1


def test_manual_optimization_steps_its_schedulers_itself():
    class Manual(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self(batch).sum())
            opt.step()

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}

    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, **QUIET)
    trainer.fit(Manual())
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 0


def test_a_scheduler_of_an_optimizer_not_returned_is_refused():
    class Model(BoringModel):
        def configure_optimizers(self) -> Any:
            opt, other = torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(other, step_size=1)]

    with pytest.raises(MisconfigurationError, match="did not return"):
        Trainer(max_epochs=1, **QUIET).fit(Model())
