"""The train/eval mode hooks, as Lightning documents them: `on_{validation,test,predict}_model_eval` put the module
in eval mode before the loop (before `on_*_start`); `on_{validation,test}_model_train`, when overridden, run after
`on_*_end` instead of the default, which gives every submodule the mode it had; `on_validation_model_zero_grad` runs
before a validation inside fit."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer


class ModeRecorder(BoringModel):
    def __init__(self) -> None:
        super().__init__(batch_size=32, length=32)
        self.calls: list[str] = []

    def _record(self, name: str) -> None:
        self.calls.append(f"{name}:{'train' if self.training else 'eval'}")

    def on_validation_model_eval(self) -> None:
        self._record("on_validation_model_eval")
        super().on_validation_model_eval()

    def on_validation_model_train(self) -> None:
        self._record("on_validation_model_train")
        super().on_validation_model_train()

    def on_validation_start(self) -> None:
        self._record("on_validation_start")

    def on_validation_end(self) -> None:
        self._record("on_validation_end")

    def on_test_model_eval(self) -> None:
        self._record("on_test_model_eval")
        super().on_test_model_eval()

    def on_test_model_train(self) -> None:
        self._record("on_test_model_train")

    def on_test_start(self) -> None:
        self._record("on_test_start")

    def on_test_end(self) -> None:
        self._record("on_test_end")

    def on_predict_model_eval(self) -> None:
        self._record("on_predict_model_eval")
        super().on_predict_model_eval()

    def on_predict_start(self) -> None:
        self._record("on_predict_start")


def test_validation_model_eval_and_train_hooks_wrap_the_validation():
    model = ModeRecorder()
    Trainer(max_epochs=1, num_sanity_val_steps=0, **QUIET).fit(model)
    assert model.calls == ["on_validation_model_eval:train", "on_validation_start:eval", "on_validation_end:eval",
                           "on_validation_model_train:eval"]
    assert model.training


def test_overridden_test_model_train_replaces_the_mode_restore():
    model = ModeRecorder()  # its on_test_model_train does not switch back to train mode
    Trainer(**QUIET).test(model)
    assert model.calls == ["on_test_model_eval:train", "on_test_start:eval", "on_test_end:eval",
                           "on_test_model_train:eval"]
    assert not model.training


def test_predict_model_eval_runs_before_predict_and_the_mode_comes_back():
    model = ModeRecorder()
    Trainer(**QUIET).predict(model)
    assert model.calls == ["on_predict_model_eval:train", "on_predict_start:eval"] and model.training


class FrozenNorm(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(2)

    def on_train_epoch_start(self) -> None:
        self.norm.eval()  # a frozen BatchNorm: it must stay in eval mode after every validation


@pytest.mark.parametrize("stage", ["validation", "test"])
def test_default_model_train_gives_every_submodule_its_own_mode_back(stage: str):
    model = FrozenNorm()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, **QUIET)
    trainer.fit(model)
    if stage == "test":
        model.train()
        model.norm.eval()
        trainer.test(model)
    assert model.training and not model.norm.training


class ZeroGradRecorder(BoringModel):
    def __init__(self) -> None:
        super().__init__(batch_size=8, length=32)  # 4 batches
        self.zero_grad_calls: list[int] = []

    def on_validation_model_zero_grad(self) -> None:
        self.zero_grad_calls.append(self.trainer.fit_state.progress.total_batches)
        super().on_validation_model_zero_grad()


def test_validation_model_zero_grad_runs_before_validation_during_fit_only():
    model = ZeroGradRecorder()
    trainer = Trainer(max_epochs=1, val_check_interval=2, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model)
    trainer.validate(model)
    assert model.zero_grad_calls == [2, 4]


def test_validation_model_zero_grad_skipped_inside_an_accumulation_window():
    model = ZeroGradRecorder()
    Trainer(max_epochs=1, val_check_interval=1, accumulate_grad_batches=2, num_sanity_val_steps=0,
            **QUIET).fit(model)
    assert model.zero_grad_calls == [2, 4]  # after batches 1 and 3 a window is open: no zero_grad there


def test_the_mode_hooks_do_not_run_for_callbacks_only_for_the_module():
    from callbacks import Callback

    class Odd(Callback):
        calls = 0

        def on_validation_model_eval(self, *args: Any) -> None:  # not a Lightning callback hook: never called
            Odd.calls += 1

    Trainer(**{**QUIET, "callbacks": [Odd()]}).validate(BoringModel())
    assert Odd.calls == 0
