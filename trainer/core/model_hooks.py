"""More TrainModule hooks with Lightning's defaults: `configure_callbacks`, `configure_model`, and the train/eval
mode hooks around evaluation and predict (called from trainer/loops/model_mode.py). Kept out of module.py for size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from torch import nn


def _module(hooks: Any) -> nn.Module:
    return cast(nn.Module, hooks)  # the mixin is only ever part of a TrainModule


class MoreModelHooks:
    """Mixed into TrainModule; every default here does what Lightning's does."""

    def configure_callbacks(self) -> Sequence[Any] | Any:
        """Return callbacks (one or a list) that this model needs; they join the Trainer's at the start of
        every run. One of the same type as a Trainer callback replaces it; ModelCheckpoints run last."""
        return []

    def configure_model(self) -> None:
        """Build layers here when they should be created at run time (every run calls it, after `setup` and
        before the strategy sets the module up); make it safe to call twice."""

    def on_validation_model_eval(self) -> None:
        """Before validation (and the sanity check): put the module in eval mode."""
        _module(self).eval()

    def on_validation_model_train(self) -> None:
        """After validation. When you override it, it runs instead of giving every submodule its mode back."""
        _module(self).train()

    def on_validation_model_zero_grad(self) -> None:
        """Before a validation inside fit (not inside an accumulation window): release the gradients."""
        _module(self).zero_grad()

    def on_test_model_eval(self) -> None:
        """Before test: put the module in eval mode."""
        _module(self).eval()

    def on_test_model_train(self) -> None:
        """After test. When you override it, it runs instead of giving every submodule its mode back."""
        _module(self).train()

    def on_predict_model_eval(self) -> None:
        """Before predict: put the module in eval mode (every submodule gets its mode back after predict)."""
        _module(self).eval()
