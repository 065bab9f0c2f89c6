"""The "never silently ignored" check: a method defined on the user's module, DataModule or callback under a
Lightning 2.x hook name that the Trainer does not call is an error at the start of fit / validate / test / predict,
naming the hook and what to do. Lightning itself refuses `training_epoch_end` & co. (removed in 2.0) the same way."""

from __future__ import annotations

from typing import Any

import pytest

import trainer.setup.lightning_names as names
from callbacks import Callback
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel
from trainer import DataModule, Trainer


class RemovedHook(BoringModel):
    def training_epoch_end(self, outputs: Any) -> None:
        raise AssertionError("never called")


@pytest.mark.parametrize("entry", ["fit", "validate", "test", "predict"])
def test_a_removed_lightning_hook_is_refused_at_the_start_of_every_entry_point(entry: str):
    with pytest.raises(MisconfigurationError, match="RemovedHook.training_epoch_end.*on_train_epoch_end"):
        getattr(Trainer(max_epochs=1, **QUIET), entry)(RemovedHook())


@pytest.mark.parametrize("name", sorted(names.REMOVED_MODULE_NAMES))
def test_every_removed_lightning_1x_module_hook_is_refused_with_what_to_do(name: str):
    model = BoringModel()
    setattr(model, name, lambda *args: None)
    expected = f"BoringModel.{name}` .*{_escaped_start(name, names.REMOVED_MODULE_NAMES)}"
    with pytest.raises(MisconfigurationError, match=expected):
        Trainer(max_epochs=1, **QUIET).fit(model)


@pytest.mark.parametrize("name", sorted(names.REMOVED_CALLBACK_NAMES))
def test_every_removed_lightning_1x_callback_hook_is_refused_with_what_to_do(name: str):
    old = type("OldCallback", (Callback,), {name: lambda self, *args: None})()
    with pytest.raises(MisconfigurationError,
                       match=f"OldCallback.{name}` .*{_escaped_start(name, names.REMOVED_CALLBACK_NAMES)}"):
        Trainer(max_epochs=1, **{**QUIET, "callbacks": [old]}).fit(BoringModel())


def _escaped_start(name: str, table: dict[str, names.Name]) -> str:
    import re

    return re.escape(table[name].note[:40])


def test_configure_sharded_model_is_refused_with_the_new_name():
    class Old(BoringModel):
        def configure_sharded_model(self) -> None:
            return None

    with pytest.raises(MisconfigurationError, match="rename the method to configure_model"):
        Trainer(max_epochs=1, **QUIET).fit(Old())


def test_the_check_runs_before_any_hook():
    class Both(RemovedHook):
        called = False

        def setup(self, stage: str) -> None:
            Both.called = True

    with pytest.raises(MisconfigurationError):
        Trainer(max_epochs=1, **QUIET).fit(Both())
    assert not Both.called


def _not_called(monkeypatch: pytest.MonkeyPatch, table: dict[str, names.Name], name: str) -> None:
    monkeypatch.setitem(table, name, names.Name(names.HOOK, names.REFUSED, "a test marks it refused"))


def test_every_hook_the_table_does_not_support_is_refused_on_the_module(monkeypatch: pytest.MonkeyPatch):
    _not_called(monkeypatch, names.MODULE_NAMES, "on_fit_start")

    class Defines(BoringModel):
        def on_fit_start(self) -> None:
            return None

    with pytest.raises(MisconfigurationError, match="Defines.on_fit_start.*a test marks it refused"):
        Trainer(max_epochs=1, **QUIET).fit(Defines())


def test_a_hook_assigned_on_the_instance_counts_too(monkeypatch: pytest.MonkeyPatch):
    _not_called(monkeypatch, names.MODULE_NAMES, "on_fit_start")
    model = BoringModel()
    model.on_fit_start = lambda: None
    with pytest.raises(MisconfigurationError, match="on_fit_start"):
        Trainer(max_epochs=1, **QUIET).fit(model)


def test_the_check_covers_callbacks_including_those_from_configure_callbacks(monkeypatch: pytest.MonkeyPatch):
    _not_called(monkeypatch, names.CALLBACK_NAMES, "on_train_start")

    class Cb(Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            return None

    class Returns(BoringModel):
        def configure_callbacks(self) -> Any:
            return [Cb()]

    with pytest.raises(MisconfigurationError, match="Cb.on_train_start"):
        Trainer(max_epochs=1, **QUIET).fit(Returns())


def test_the_check_covers_the_datamodule(monkeypatch: pytest.MonkeyPatch):
    _not_called(monkeypatch, names.DATAMODULE_NAMES, "teardown")

    class Data(DataModule):
        def teardown(self, stage: str) -> None:
            return None

    with pytest.raises(MisconfigurationError, match="Data.teardown"):
        Trainer(max_epochs=1, **QUIET).fit(BoringModel(), datamodule=Data())


def test_methods_a_user_calls_are_not_refused_when_defined():
    class OwnPrint(BoringModel):
        def print(self, *args: Any, **kwargs: Any) -> None:  # a method the user calls: theirs is fine
            return None

        def to_torchscript(self, *args: Any, **kwargs: Any) -> Any:  # refused by us, but the user's own runs
            return None

    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(OwnPrint())
    assert trainer.global_step == 1
