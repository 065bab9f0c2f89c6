"""Fit loop limits and cadences: epochs, steps, time, limit_*_batches, validation cadence, sanity steps."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import Callback
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer


class CountingModel(BoringModel):
    """Counts training and validation batches per epoch."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.train_batches: list[tuple[int, int]] = []
        self.val_batches: list[tuple[int, int, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.train_batches.append((self.current_epoch, batch_idx))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.val_batches.append((self.current_epoch, self.global_step, batch_idx))
        return super().validation_step(batch, batch_idx)


def test_max_epochs_and_counters():
    model = CountingModel()  # 8 batches per epoch
    trainer = Trainer(max_epochs=2, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model)
    assert trainer.current_epoch == 2 and trainer.global_step == 16
    assert len(model.train_batches) == 16
    assert trainer.state.finished and trainer.state.fn.value == "fit"


def test_max_steps_stops_mid_epoch():
    model = CountingModel()
    trainer = Trainer(max_steps=11, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model)
    assert trainer.global_step == 11 and len(model.train_batches) == 11


def test_max_steps_counts_optimizer_steps_with_accumulation():
    model = CountingModel()
    trainer = Trainer(max_steps=3, accumulate_grad_batches=2, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model)
    assert trainer.global_step == 3 and len(model.train_batches) == 6


@pytest.mark.parametrize(("limit", "batches"), [(3, 3), (0.5, 4), (0.01, 1), (1.0, 8), (100, 8)])
def test_limit_train_batches(limit: float | int, batches: int):
    model = CountingModel()
    Trainer(max_epochs=1, limit_train_batches=limit, num_sanity_val_steps=0, **QUIET).fit(model)
    assert len(model.train_batches) == batches


def test_limit_val_batches_zero_disables_validation():
    model = CountingModel()
    trainer = Trainer(max_epochs=1, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert model.val_batches == [] and "val_loss" not in trainer.callback_metrics


def test_sanity_check_runs_num_sanity_val_steps_and_logs_nothing():
    model = CountingModel()
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0.25, num_sanity_val_steps=1, **QUIET)
    trainer.fit(model)
    # one sanity batch at step 0, then the 2 (= 25%) validation batches after the training batch
    assert model.val_batches == [(0, 0, 0), (0, 1, 0), (0, 1, 1)]


def test_sanity_check_results_are_discarded():
    seen: dict[str, Any] = {}

    class Spy(Callback):
        def on_sanity_check_end(self, trainer, module):  # noqa: ANN001
            seen["metrics"] = dict(trainer.callback_metrics)

    Trainer(max_epochs=1, limit_train_batches=1, callbacks=[Spy()], **QUIET).fit(BoringModel())
    assert seen["metrics"] == {}


@pytest.mark.parametrize(
    ("interval", "every_n", "expected_steps"),
    [
        (0.5, 1, [4, 8, 12, 16]),  # twice per epoch
        (1.0, 1, [8, 16]),
        (3, 1, [3, 6, 11, 14]),  # every 3 batches within an epoch
        (1.0, 2, [16]),  # every second epoch
        (5, None, [5, 10, 15]),  # every 5 batches counted across epochs
    ],
)
def test_validation_cadence(interval: float | int, every_n: int | None, expected_steps: list[int]):
    model = CountingModel()
    trainer = Trainer(max_epochs=2, val_check_interval=interval, check_val_every_n_epoch=every_n,
                      num_sanity_val_steps=0, limit_val_batches=1, **QUIET)
    trainer.fit(model)
    assert [step for _, step, _ in model.val_batches] == expected_steps


def test_fast_dev_run_runs_one_batch_of_each():
    model = CountingModel()
    trainer = Trainer(fast_dev_run=True, **{**QUIET, "logger": True, "enable_checkpointing": True})
    trainer.fit(model)
    assert model.train_batches == [(0, 0)] and len(model.val_batches) == 1
    assert [type(lg).__name__ for lg in trainer.loggers] == ["DummyLogger"]
    assert trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path == ""  # kept, idle


def test_under_fast_dev_run_the_logger_takes_any_call_and_writes_nothing(tmp_path: Path):
    from callbacks import ModelCheckpoint
    from trainer.loggers import CSVLogger, DummyLogger

    class UsesTheExperiment(CountingModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.logger.experiment.add_image("x", batch[0])  # a TensorBoard call, on whatever logger there is
            self.log("loss_seen", 1.0)
            return super().training_step(batch, batch_idx)

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True, every_n_train_steps=1)
    trainer = Trainer(fast_dev_run=2, default_root_dir=tmp_path, callbacks=[checkpoint],
                      **{**QUIET, "logger": CSVLogger(tmp_path / "logs"), "enable_checkpointing": True})
    trainer.fit(UsesTheExperiment())
    assert trainer.checkpoint_callback is checkpoint  # a given ModelCheckpoint stays, and saves nothing (Lightning's)
    assert isinstance(trainer.logger, DummyLogger) and trainer.logger[0] is trainer.logger
    assert not (tmp_path / "logs").exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    no_logger = Trainer(fast_dev_run=True, **{**QUIET, "logger": False})
    assert no_logger.loggers == []  # logger=False keeps none, as in Lightning


def test_should_stop_set_in_training_step_stops_after_that_batch():
    class Stopper(CountingModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 2:
                self.trainer.should_stop = True
            return super().training_step(batch, batch_idx)

    model = Stopper()
    trainer = Trainer(max_epochs=5, num_sanity_val_steps=0, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert len(model.train_batches) == 3 and trainer.current_epoch == 1


def test_min_epochs_overrides_should_stop():
    class Stopper(CountingModel):
        def on_train_epoch_start(self) -> None:
            self.trainer.should_stop = True

    model = Stopper()
    trainer = Trainer(max_epochs=5, min_epochs=2, num_sanity_val_steps=0, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert trainer.current_epoch == 2 and len(model.train_batches) == 16


def test_max_time_stops_training():
    class Slow(CountingModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(0.3)
            return super().training_step(batch, batch_idx)

    model = Slow()
    trainer = Trainer(max_time={"seconds": 1}, num_sanity_val_steps=0, limit_val_batches=0, **QUIET)
    start = time.monotonic()
    trainer.fit(model)
    assert time.monotonic() - start < 5
    assert 2 <= len(model.train_batches) <= 6 and trainer.current_epoch == 1


def test_max_time_string_form_parses():
    assert Trainer(max_time="00:01:30:00", **QUIET).fit_state.spec.max_time.total_seconds() == 5400


def test_training_step_returning_none_skips_the_optimizer_step():
    class Skipper(CountingModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            return None if batch_idx % 2 else loss

    model = Skipper()
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert len(model.train_batches) == 8 and trainer.global_step == 4


def test_on_train_batch_start_returning_minus_one_ends_the_epoch():
    class Early(CountingModel):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
            return -1 if batch_idx == 3 else None

    model = Early()
    trainer = Trainer(max_epochs=2, num_sanity_val_steps=0, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert model.train_batches == [(e, b) for e in range(2) for b in range(3)]


def test_dict_output_with_extra_keys_reaches_on_train_batch_end():
    received: list[Any] = []

    class DictModel(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self(batch).sum()
            return {"loss": loss, "extra": batch_idx}

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            received.append(outputs)

    Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET).fit(DictModel())
    assert [o["extra"] for o in received] == [0, 1]
    assert all(not o["loss"].requires_grad for o in received)


def test_gradient_clip_by_value():
    grads: list[float] = []

    class Big(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self(batch).sum() * 1000

        def on_train_batch_end(self, *args: Any) -> None:  # the step's clipped gradients stay until the next zero_grad
            grads.append(max(p.grad.abs().max().item() for p in self.parameters()))

    Trainer(max_epochs=1, limit_train_batches=2, gradient_clip_val=0.25, gradient_clip_algorithm="value",
            limit_val_batches=0, **QUIET).fit(Big())
    assert grads and max(grads) <= 0.25


def test_deterministic_flag_enables_deterministic_algorithms():
    Trainer(max_epochs=1, limit_train_batches=1, deterministic=True, limit_val_batches=0, **QUIET).fit(BoringModel())
    assert torch.are_deterministic_algorithms_enabled()


def test_trainer_state_properties():
    trainer = Trainer(max_epochs=1, limit_train_batches=2, **QUIET)
    trainer.fit(BoringModel())
    assert (trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size) == (0, 0, 0, 1)
    assert trainer.is_global_zero and trainer.precision == "32-true"
    assert trainer.strategy.root_device == torch.device("cpu")
    assert trainer.logger is None and trainer.loggers == []


@pytest.mark.parametrize(("limits", "reached"), [({"max_epochs": 2}, "`max_epochs=2`"),
                                                  ({"max_steps": 11, "max_epochs": 5}, "`max_steps=11`")])
def test_a_second_fit_after_the_limit_trains_nothing_and_says_so(limits: dict, reached: str,
                                                                 capsys: pytest.CaptureFixture):
    model = CountingModel()
    trainer = Trainer(num_sanity_val_steps=0, **limits, **QUIET)
    trainer.fit(model)
    counters, weights, batches = (trainer.global_step, trainer.current_epoch), model.layer.weight.clone(), len(
        model.train_batches)
    capsys.readouterr()
    trainer.fit(model)  # Lightning: "`Trainer.fit` stopped: `max_epochs=2` reached." and nothing else
    out = capsys.readouterr().out
    assert f"`Trainer.fit` stopped: {reached} reached; this Trainer has nothing left to train" in out
    assert (trainer.global_step, trainer.current_epoch) == counters and len(model.train_batches) == batches
    assert torch.equal(model.layer.weight, weights)


def test_a_second_fit_after_should_stop_goes_on_from_the_counters():
    """As in Lightning: should_stop is cleared and the next epoch starts; counters are not restarted."""

    class StopAt5(Callback):
        def on_train_batch_end(self, trainer, *args):  # noqa: ANN001, ANN002, ANN201
            if trainer.global_step == 5 and trainer.current_epoch == 0:
                trainer.should_stop = True

    model = CountingModel()
    trainer = Trainer(max_epochs=3, num_sanity_val_steps=0, callbacks=[StopAt5()], **QUIET)
    trainer.fit(model)
    assert (trainer.global_step, trainer.current_epoch, trainer.should_stop) == (5, 1, True)
    trainer.fit(model)
    assert (trainer.global_step, trainer.current_epoch, trainer.should_stop) == (21, 3, False)
    assert [epoch for epoch, _ in model.train_batches] == [0] * 5 + [1] * 8 + [2] * 8


def test_an_int_val_check_interval_beyond_the_epoch_is_refused_when_the_fit_starts():
    trainer = Trainer(max_epochs=1, val_check_interval=100, **QUIET)  # 8 batches per epoch
    with pytest.raises(ValueError, match="never validate"):
        trainer.fit(BoringModel())
    Trainer(max_epochs=1, val_check_interval=100, limit_val_batches=0, **QUIET).fit(BoringModel())  # no validation
    Trainer(max_steps=2, val_check_interval=100, check_val_every_n_epoch=None, **QUIET).fit(BoringModel())


def test_a_fraction_of_an_epoch_without_check_val_every_n_epoch_is_refused():
    from trainer.exceptions import ConfigError

    with pytest.raises(ConfigError, match="fraction of an epoch"):
        Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)


def test_fewer_batches_than_log_every_n_steps_is_warned_about(tmp_path: Any):
    from trainer.loggers import CSVLogger

    with pytest.warns(UserWarning, match="fewer than log_every_n_steps=50"):
        Trainer(max_epochs=1, **{**QUIET, "logger": CSVLogger(save_dir=str(tmp_path))}).fit(BoringModel())
