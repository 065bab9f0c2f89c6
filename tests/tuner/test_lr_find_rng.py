"""lr_find leaves the random generators as it found them (calling it twice gives the same curve), and sweeps as many
windows as asked, skipped ones included."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, seed_everything
from trainer.tuner import Tuner


class _Positive(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.lr = 0.1

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self(batch).pow(2).mean()


def test_lr_find_twice_gives_the_same_curve_and_leaves_the_rng_alone():
    seed_everything(1)
    model, trainer = _Positive(), Trainer(max_epochs=1, **QUIET)
    before = torch.get_rng_state()
    first = Tuner(trainer).lr_find(model, num_training=8, update_attr=False).results
    assert torch.equal(torch.get_rng_state(), before)
    assert Tuner(trainer).lr_find(model, num_training=8, update_attr=False).results == first


def test_a_module_without_a_learning_rate_is_an_attribute_error_too():
    with pytest.raises(AttributeError, match="lr_find"):
        Tuner(Trainer(max_epochs=1, **QUIET)).lr_find(BoringModel(), num_training=4)


def test_windows_whose_step_returned_none_advance_the_sweep():
    """Lightning counts them as steps: the sweep records a NaN for each and still ends after num_training windows
    (here a skipped step does not count in global_step, so the sweep keeps its own count)."""

    class Skips(_Positive):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return None if batch_idx % 2 else super().training_step(batch, batch_idx)

    result = Tuner(Trainer(max_epochs=1, **QUIET)).lr_find(Skips(), num_training=6, update_attr=False,
                                                           early_stop_threshold=None).results
    assert len(result["lr"]) == len(result["loss"]) == 6
    assert [loss != loss for loss in result["loss"]] == [False, True] * 3  # NaN for the skipped ones
