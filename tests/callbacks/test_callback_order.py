"""The Trainer's callback list in Lightning's order (the tuner's callbacks first, the checkpoint callbacks last),
`configure_callbacks` merging, and which callbacks may share a `state_key`: only those without a state."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from callbacks import (
    BatchSizeFinder,
    Callback,
    Checkpoint,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    OnExceptionCheckpoint,
    ProgressBar,
)
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.exceptions import StateKeyCollisionError
from trainer.loggers import CSVLogger

RUN = {**QUIET, "max_steps": 1, "limit_val_batches": 1, "num_sanity_val_steps": 0}


def test_checkpoint_callbacks_go_last_in_the_order_given(tmp_path):
    first, second = ModelCheckpoint(tmp_path / "a", monitor="x"), ModelCheckpoint(tmp_path / "b", monitor="y")
    on_error, bar, lr, summary = OnExceptionCheckpoint(tmp_path), ProgressBar(), LearningRateMonitor(), ModelSummary()
    trainer = Trainer(callbacks=[first, on_error, bar, lr, summary, second])
    assert trainer.callbacks == [bar, lr, summary, first, on_error, second]


class Returns(BoringModel):
    def __init__(self, returned: list[Callback]) -> None:
        super().__init__()
        self.returned = returned
        self.seen: list[Callback] = []

    def configure_callbacks(self) -> Any:
        return self.returned

    def on_fit_start(self) -> None:
        self.seen = list(self.trainer.callbacks)


def test_configure_callbacks_replaces_the_same_types_and_keeps_lightnings_order(tmp_path, capsys):
    bar, lr, given_ckpt = ProgressBar(), LearningRateMonitor(), ModelCheckpoint(tmp_path, filename="given")
    ckpt1, ckpt2 = ModelCheckpoint(tmp_path / "1", monitor="a"), ModelCheckpoint(tmp_path / "2", monitor="b")
    stop, summary = EarlyStopping("val_loss", strict=False), ModelSummary()
    model = Returns([ckpt2, stop, summary, ckpt1])
    Trainer(**{**RUN, "enable_checkpointing": True, "enable_progress_bar": True, "logger": CSVLogger(tmp_path),
               "callbacks": [bar, lr, given_ckpt]}).fit(model)
    assert model.seen == [bar, lr, stop, summary, ckpt2, ckpt1]
    assert "will override existing callbacks passed to Trainer: ModelCheckpoint" in capsys.readouterr().out


def test_a_users_checkpoint_callback_goes_last_too():
    class Saves(Checkpoint):
        pass

    saves, bar = Saves(), ProgressBar()
    assert Trainer(callbacks=[saves, bar], enable_checkpointing=False, enable_model_summary=False).callbacks == \
        [bar, saves]


def test_the_tuners_callbacks_go_first(tmp_path):
    bar, finder, ckpt = ProgressBar(), BatchSizeFinder(), ModelCheckpoint(tmp_path)
    assert Trainer(callbacks=[ckpt, bar, finder]).callbacks[0] is finder


def test_callbacks_without_a_state_may_repeat():
    twice = [LearningRateMonitor(), LearningRateMonitor(), Callback(), Callback()]
    assert Trainer(callbacks=twice, **QUIET).callbacks == twice


class Stateful(Callback):
    def __init__(self, unique: str | None = None, other: int = 0) -> None:
        self.unique, self.other = unique, other

    @property
    def state_key(self) -> str:
        return self._generate_state_key(unique=self.unique)

    def state_dict(self) -> dict[str, Any]:
        return {"unique": self.unique}


def test_callbacks_with_a_state_must_have_their_own_key():
    with pytest.raises(StateKeyCollisionError, match="more than one stateful callback of type `Stateful`") as error:
        Trainer(callbacks=[Stateful("one", 1), Stateful("one", 2)], **QUIET)
    assert isinstance(error.value, RuntimeError)  # the type Lightning raises
    with pytest.raises(RuntimeError, match="more than one stateful callback"):
        Trainer(**RUN).fit(Returns([Stateful("one"), Stateful("one")]))


def test_each_state_is_saved_under_lightnings_key(tmp_path):
    trainer = Trainer(**{**RUN, "enable_checkpointing": True,
                         "callbacks": [Stateful(), ModelCheckpoint(tmp_path, filename="all"), Stateful("two")]})
    trainer.fit(BoringModel())
    saved = torch.load(tmp_path / "all.ckpt", weights_only=True)["callbacks"]
    assert saved["Stateful{'unique': None}"] == {"unique": None}
    assert saved["Stateful{'unique': 'two'}"] == {"unique": "two"}
