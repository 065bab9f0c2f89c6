"""EarlyStopping as Lightning 2.6 has it: `stopping_reason` (an `EarlyStoppingReason`) and its message, their place in
the callback's state, Lightning's `state_key`, a missing metric as a RuntimeError, and where the check runs (at the
epoch end, or after each validation when validation runs inside the epoch). Lightning's own callback runs the same
curve beside ours (the oracle)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from callbacks import EarlyStopping, EarlyStoppingReason
from tests.helpers.curves import fit_lightning, fit_ours

CASES = [  # (values per epoch, options, the reason, a part of its message)
    ([5.0, 4.0, 4.0, 4.0, 4.0, 1.0], {"patience": 2}, "PATIENCE_EXHAUSTED", "did not improve in the last 2"),
    ([5.0, 4.0, 3.0, 2.0, 1.0, 0.0], {"stopping_threshold": 2.5}, "STOPPING_THRESHOLD",
     "Stopping threshold reached"),
    ([1.0, 2.0, 99.0, 2.0, 1.0, 0.0], {"divergence_threshold": 50.0}, "DIVERGENCE_THRESHOLD",
     "Divergence threshold reached"),
    ([1.0, math.nan, 1.0, 1.0, 1.0, 1.0], {}, "NON_FINITE_METRIC", "is not finite"),
    ([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], {}, "NOT_STOPPED", None),
]


def _outcome(callback: Any) -> tuple[str, int, str | None]:
    message = callback.stopping_reason_message
    return callback.stopping_reason.name, callback.stopped_epoch, message


@pytest.mark.parametrize(("values", "options", "reason", "words"), CASES)
def test_the_stopping_reason_is_lightnings(values: list[float], options: dict[str, Any], reason: str,
                                           words: str | None):
    pl = pytest.importorskip("lightning.pytorch")
    ours = EarlyStopping(monitor="val_score", **options)
    fit_ours([ours], values, enable_checkpointing=False)
    theirs = pl.callbacks.EarlyStopping(monitor="val_score", **options)
    fit_lightning([theirs], values)
    assert isinstance(ours.stopping_reason, EarlyStoppingReason)
    assert ours.stopping_reason.name == reason
    name, epoch, message = _outcome(ours)
    assert (name, epoch) == _outcome(theirs)[:2]
    assert (message is None) == (words is None) and (words is None or words in message)


def test_the_reason_is_kept_in_the_callbacks_state():
    stopped = EarlyStopping(monitor="val_loss")
    stopped.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
    stopped.stopping_reason_message = "it diverged"
    restored = EarlyStopping(monitor="val_loss")
    restored.load_state_dict(stopped.state_dict())
    assert (restored.stopping_reason, restored.stopping_reason_message) == \
        (EarlyStoppingReason.DIVERGENCE_THRESHOLD, "it diverged")
    older = {"wait_count": 2, "stopped_epoch": 3, "best_score": torch.tensor(0.5), "patience": 4}
    restored.load_state_dict(older)  # a state saved before Lightning 2.6 added the reason
    assert (restored.stopping_reason, restored.stopping_reason_message) == (EarlyStoppingReason.NOT_STOPPED, None)
    assert (restored.wait_count, restored.patience) == (2, 4)


def test_the_state_key_is_lightnings():
    pl = pytest.importorskip("lightning.pytorch")
    theirs = pl.callbacks.EarlyStopping("val_loss", mode="max")
    assert EarlyStopping("val_loss", mode="max").state_key == theirs.state_key


def test_a_missing_metric_is_a_runtime_error_naming_it():
    with pytest.raises(RuntimeError, match="metric `nope` which is not available"):
        fit_ours([EarlyStopping(monitor="nope")], [1.0, 1.0], enable_checkpointing=False)


def test_several_validations_per_epoch_are_each_a_check():
    """With validation inside the epoch (`val_check_interval=0.5`), each validation counts against `patience`."""
    pl = pytest.importorskip("lightning.pytorch")
    flags = {"val_check_interval": 0.5, "limit_train_batches": 4}
    ours, theirs = EarlyStopping("val_score", patience=2), pl.callbacks.EarlyStopping("val_score", patience=2)
    trainer = fit_ours([ours], [1.0] * 4, enable_checkpointing=False, **flags)
    assert ours.stopped_epoch == 1  # checks at batches 2, 4 of epoch 0 and 2 of epoch 1: a best, then 2 without gain
    assert fit_lightning([theirs], [1.0] * 4, **flags).current_epoch == trainer.current_epoch
    assert (theirs.stopped_epoch, theirs.wait_count) == (ours.stopped_epoch, ours.wait_count)


def test_the_trainer_lists_its_early_stopping_callbacks():
    from trainer import Trainer

    first, second = EarlyStopping("a"), EarlyStopping("b")
    trainer = Trainer(callbacks=[first, second], enable_progress_bar=False, enable_model_summary=False)
    assert trainer.early_stopping_callbacks == [first, second] and trainer.early_stopping_callback is first


def test_resuming_past_max_epochs_is_refused_naming_both(tmp_path):
    from callbacks import ModelCheckpoint
    from strategies.exceptions import ConfigError
    from tests.helpers.boring import QUIET, BoringModel
    from trainer import Trainer

    saver = ModelCheckpoint(dirpath=tmp_path)
    Trainer(**{**QUIET, "enable_checkpointing": True, "max_epochs": 3, "callbacks": [saver]}).fit(BoringModel())
    with pytest.raises(ConfigError, match=r"restored a checkpoint with current_epoch=3, but you have set "
                                          r"Trainer\(max_epochs=1\)"):
        Trainer(**{**QUIET, "max_epochs": 1}).fit(BoringModel(), ckpt_path=saver.best_model_path)
