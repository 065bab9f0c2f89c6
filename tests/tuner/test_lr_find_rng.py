"""lr_find leaves the random generators as it found them, so calling it twice gives the same curve."""

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
