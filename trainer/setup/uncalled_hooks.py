"""The "never silently ignored" check: at the start of fit, validate, test and predict, a method defined on the
user's TrainModule, DataModule or callbacks under a Lightning 2.x hook name that this Trainer does not call is an
error naming the hook and what to do (trainer/setup/lightning_names.py holds the names and their status).

Why: a ported `optimizer_step` override that is never called trains a different model without any message.
"""

from __future__ import annotations

from typing import Any

from strategies.exceptions import MisconfigurationError
from trainer.setup.lightning_names import (
    CALLBACK_NAMES,
    DATAMODULE_NAMES,
    HOOK,
    MODULE_NAMES,
    REMOVED_CALLBACK_NAMES,
    REMOVED_MODULE_NAMES,
    SUPPORTED,
    Name,
)

_NOT_CALLED = ("this Trainer does not call it: remove the method, or move what it does into training_step or a "
               "Callback (docs/from-lightning.md lists every Lightning name and its status)")


def _user_defined(obj: Any, base: type) -> set[str]:
    """Names defined by the classes of `obj` that are not `base` or its ancestors, and callables set on it."""
    own = set(base.__mro__)
    names = {name for cls in type(obj).__mro__ if cls not in own for name in vars(cls)}
    names.update(name for name, value in getattr(obj, "__dict__", {}).items() if callable(value))
    return names


def _uncalled(obj: Any, base: type, table: dict[str, Name]) -> list[str]:
    problems = []
    for name in sorted(_user_defined(obj, base) & table.keys()):
        entry = table[name]
        if entry.kind == HOOK and entry.status != SUPPORTED:
            why = entry.note or _NOT_CALLED
            problems.append(f"`{type(obj).__name__}.{name}` is a Lightning hook that is not called here; {why}.")
    return problems


def refuse_uncalled_hooks(module: Any, datamodule: Any, callbacks: list[Any]) -> None:
    """Raise MisconfigurationError naming every Lightning hook the user defined that would never be called
    (Lightning 1.x hooks that 2.x removed included)."""
    from trainer.core.datamodule import DataModule
    from trainer.core.module import TrainModule

    problems = _uncalled(module, TrainModule, {**MODULE_NAMES, **REMOVED_MODULE_NAMES})
    if datamodule is not None:
        problems += _uncalled(datamodule, DataModule, DATAMODULE_NAMES)
    if callbacks:
        from callbacks.base import Callback

        for callback in callbacks:
            problems += _uncalled(callback, Callback, {**CALLBACK_NAMES, **REMOVED_CALLBACK_NAMES})
    if problems:
        raise MisconfigurationError("\n".join(problems))
