"""`configure_callbacks()`, as Lightning documents it: the callbacks a module returns join the Trainer's at the start
of a run; one whose type matches a Trainer callback's replaces it; ModelCheckpoint callbacks run last."""

from __future__ import annotations

from typing import Any

import pytest

from callbacks import Callback, EarlyStopping, ModelCheckpoint
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer


class Counter(Callback):
    def __init__(self) -> None:
        self.epochs = 0

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.epochs += 1


class ReturnsCallbacks(BoringModel):
    def __init__(self, returned: Any) -> None:
        super().__init__()
        self.returned = returned

    def configure_callbacks(self) -> Any:
        return self.returned


def test_configure_callbacks_adds_callbacks_whose_hooks_run():
    counter = Counter()
    Trainer(max_epochs=2, limit_val_batches=0, **QUIET).fit(ReturnsCallbacks(counter))  # one callback, not a list
    assert counter.epochs == 2


def test_configure_callbacks_replaces_a_trainer_callback_of_the_same_type():
    given, returned = EarlyStopping(monitor="val_loss", patience=7), EarlyStopping(monitor="val_loss", patience=1)
    trainer = Trainer(max_epochs=1, callbacks=[given], **QUIET)
    trainer.fit(ReturnsCallbacks([returned]))
    stoppers = [cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping)]
    assert stoppers == [returned]


def test_configure_callbacks_puts_checkpoint_callbacks_last(tmp_path: Any):
    checkpoint, counter = ModelCheckpoint(dirpath=tmp_path), Counter()
    trainer = Trainer(max_epochs=1, limit_val_batches=0, **{**QUIET, "enable_checkpointing": True})
    trainer.fit(ReturnsCallbacks([checkpoint, counter]))
    assert trainer.callbacks[-1] is checkpoint and counter in trainer.callbacks


def test_configure_callbacks_twice_does_not_duplicate():
    counter = Counter()
    trainer = Trainer(max_epochs=1, limit_val_batches=0, **QUIET)
    model = ReturnsCallbacks([counter])
    trainer.fit(model)
    trainer.validate(model)
    assert sum(cb is counter for cb in trainer.callbacks) == 1


def test_configure_callbacks_refuses_what_is_not_a_callback():
    with pytest.raises(MisconfigurationError, match="configure_callbacks\\(\\) returned"):
        Trainer(max_epochs=1, **QUIET).fit(ReturnsCallbacks([object()]))
