"""`is_overridden(method_name, instance, parent)`: Lightning's question "does the user's object define this hook?",
with Lightning's signature and default parent (TrainModule, DataModule or Callback, from the instance's type).

The Trainer's own dispatch asks the same with trainer.hooks.is_overridden, which takes the base class it is given."""

from __future__ import annotations

from typing import Any

from callbacks.base import Callback
from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule
from trainer.hooks import is_overridden as _defined_differently


def is_overridden(method_name: str, instance: Any = None, parent: type | None = None) -> bool:
    """Whether `instance` defines `method_name` other than `parent` does (an instance attribute counts).

    `parent` defaults to TrainModule, DataModule or Callback, whichever `instance` is; `instance=None` is False (as
    when a Trainer has no module yet). A ValueError when no parent is given or found, or when the parent does not
    define the method at all (a misspelt name would otherwise be False forever)."""
    if instance is None:
        return False
    if parent is None:
        parent = next((base for base in (TrainModule, DataModule, Callback) if isinstance(instance, base)), None)
        if parent is None:
            raise ValueError(f"is_overridden({method_name!r}, {type(instance).__name__}): pass `parent=`, the class "
                             "whose method counts as not overridden.")
    if getattr(parent, method_name, None) is None:
        raise ValueError(f"is_overridden: {parent.__name__} has no method {method_name!r}.")
    return _defined_differently(instance, method_name, parent)
