"""Every public attribute, property and argument of Lightning 2.x's Trainer exists here, with Lightning's meaning or
a clear refusal (the Lightning comparisons are skipped without Lightning installed)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import Callback, EarlyStopping
from strategies import MixedPrecision
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.exceptions import ConfigError

_REFUSED = {"fit_loop", "validate_loop", "test_loop", "accelerator"}  # Lightning internals: an AttributeError says so


def _lightning_trainer() -> Any:
    pl = pytest.importorskip("lightning.pytorch")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False)


def test_every_public_name_of_lightnings_trainer_exists_here():
    theirs = {name for name in dir(_lightning_trainer()) if not name.startswith("_")}
    ours = Trainer(**QUIET)
    names = set(dir(type(ours))) | set(vars(ours))  # not hasattr: some properties need a run to be read
    assert sorted(theirs - _REFUSED - names) == []
    for name in _REFUSED:
        with pytest.raises(AttributeError, match="internal"):
            getattr(ours, name)


@pytest.mark.parametrize("method", ["__init__", "fit", "validate", "test", "predict", "save_checkpoint"])
def test_every_argument_of_lightnings_trainer_methods_exists_here(method: str):
    theirs = set(inspect.signature(getattr(type(_lightning_trainer()), method)).parameters)
    assert theirs - set(inspect.signature(getattr(Trainer, method)).parameters) == set()


def test_flags_read_back_as_lightning_keeps_them():
    trainer = Trainer(fast_dev_run=True, **QUIET)
    assert trainer.fast_dev_run is True and trainer.limit_train_batches == 1 and trainer.num_sanity_val_steps == 0
    assert Trainer(fast_dev_run=1, **QUIET).fast_dev_run is True and Trainer(fast_dev_run=3, **QUIET).fast_dev_run == 3
    trainer = Trainer(limit_test_batches=1e50, num_sanity_val_steps=-1, min_steps=None, **QUIET)
    assert trainer.limit_test_batches == int(1e50) and trainer.num_sanity_val_steps == math.inf
    assert trainer.min_steps is None and trainer.reload_dataloaders_every_n_epochs == 0
    assert trainer.device_ids == [0] and trainer.precision_plugin is trainer.strategy.precision
    assert trainer.scaler is None and trainer.distributed_sampler_kwargs is None


class _Watch(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool]] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append((trainer.is_last_batch, trainer.evaluating))

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.seen.append((trainer.is_last_batch, trainer.evaluating))


def test_run_state_properties():
    watch = _Watch()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
                      callbacks=[watch, EarlyStopping("val_loss")], **QUIET)
    trainer.fit(BoringModel())
    assert watch.seen == [(False, False), (True, False), (True, True)]
    assert trainer.val_check_batch == 2 and trainer.enable_validation and not trainer.interrupted
    assert [type(cb).__name__ for cb in trainer.early_stopping_callbacks] == ["EarlyStopping"]


def test_ckpt_path_reports_the_loaded_checkpoint_and_can_be_set_for_the_next_runs(tmp_path: Path):
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    model = BoringModel()
    trainer.fit(model)
    assert trainer.ckpt_path is None
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    trainer.ckpt_path = tmp_path / "a.ckpt"
    trainer.validate(model, verbose=False)
    trainer.ckpt_path = None
    assert Path(trainer.ckpt_path) == tmp_path / "a.ckpt"  # the one the validation loaded


def test_weights_only_is_taken_and_false_is_refused():
    trainer = Trainer(**QUIET)
    assert trainer.validate(BoringModel(), verbose=False, weights_only=True)
    with pytest.raises(ConfigError, match="weights_only=False"):
        trainer.test(BoringModel(), verbose=False, weights_only=False)


def test_a_precision_plugin_is_the_precision_and_other_plugins_are_refused():
    plugin = MixedPrecision("bf16-mixed", "cpu")
    trainer = Trainer(plugins=[plugin], **QUIET)
    assert trainer.precision == "bf16-mixed" and trainer.strategy.precision is plugin
    with pytest.raises(ConfigError, match="only a precision plugin"):
        Trainer(plugins=[object()], **QUIET)
    with pytest.raises(ConfigError, match="conflicts"):
        Trainer(plugins=plugin, precision="64-true", **QUIET)


def test_autolog_hparams_can_be_switched_off():
    from trainer.loggers import Logger

    class Memory(Logger):
        name, version = "m", 0

        def __init__(self) -> None:
            self.params: dict[str, Any] = {}

        def log_metrics(self, metrics: Any, step: Any = None) -> None:
            pass

        def log_hyperparams(self, params: Any) -> None:
            self.params.update(params)

    class Model(BoringModel):
        def __init__(self, width: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters()

    for enabled, expected in ((True, {"width": 3}), (False, {})):
        logger = Memory()
        Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, enable_autolog_hparams=enabled,
                **{**QUIET, "logger": logger}).fit(Model())
        assert logger.params == expected


def test_the_arguments_without_an_object_here_are_refused_by_name():
    with pytest.raises(ConfigError, match="model_registry"):
        Trainer(model_registry="my-model", **QUIET)
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(BoringModel())
    with pytest.raises(ConfigError, match="storage_options"):
        trainer.save_checkpoint("x.ckpt", storage_options={"anon": True})


def test_print_prints_on_the_first_process(capsys: pytest.CaptureFixture[str]):
    Trainer(**QUIET).print("hello", torch.tensor(1).item())
    assert capsys.readouterr().out == "hello 1\n"
