"""The loop's typed state (trainer/loops/fit_state.py) and what the Trainer makes public from it for callbacks."""

from __future__ import annotations

from typing import Any

import pytest

from callbacks import Callback
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer


def test_using_results_puts_the_previous_results_back_however_the_block_ends():
    loop = Trainer(**QUIET).fit_state
    evaluation = loop.new_eval_results()
    with pytest.raises(ValueError, match="inside"), loop.using_results(evaluation) as results:
        assert loop.results is results is evaluation
        raise ValueError("inside")
    assert loop.results is loop.train_results


class RecordsPublicState(Callback):
    """Reads only public Trainer state, as a third-party callback would."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}
        self.batches: list[int] = []

    def on_sanity_check_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.seen["before sanity loaders"] = trainer.num_sanity_val_batches  # requested after this hook (Lightning)

    def on_validation_start(self, trainer: Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking:
            self.seen["sanity"] = (trainer.sanity_checking, trainer.validating, trainer.num_sanity_val_batches)
        else:
            self.seen["validation"] = (trainer.validating, trainer.num_val_batches)

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.batches.append(trainer.total_batches)

    def on_test_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.seen["test"] = (trainer.testing, trainer.num_test_batches)

    def on_predict_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.seen["predict"] = (trainer.predicting, trainer.num_predict_batches)


def test_callbacks_read_batch_counts_stage_and_progress_from_public_properties():
    recorder = RecordsPublicState()
    trainer = Trainer(max_epochs=2, limit_train_batches=5, limit_val_batches=3, num_sanity_val_steps=2,
                      limit_test_batches=2, limit_predict_batches=4, callbacks=[recorder], **QUIET)
    model = BoringModel()
    trainer.fit(model)
    trainer.test(model)
    trainer.predict(model)
    assert recorder.seen == {"before sanity loaders": [], "sanity": (True, False, [2]), "validation": (True, [3]),
                             "test": (True, [2]), "predict": (True, [4])}
    assert recorder.batches == list(range(10)) and trainer.total_batches == 10
