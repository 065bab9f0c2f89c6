"""LambdaCallback: a callback made of functions, one per hook (Lightning's `LambdaCallback`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from callbacks.base import Callback

_HOOKS = frozenset(name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown"))


class LambdaCallback(Callback):
    """Each keyword names a hook and gives the function to run there, with the hook's arguments
    (`trainer, pl_module, ...`). An unknown hook name is an error, not a function that is never called.

    Example:
        ```python
        trainer = Trainer(callbacks=[LambdaCallback(on_train_epoch_end=lambda trainer, pl_module: print("done"))])
        ```
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(set(hooks) - _HOOKS)
        if unknown:
            raise TypeError(f"LambdaCallback got {', '.join(unknown)}, which are not callback hooks; the hooks are "
                            f"{', '.join(sorted(_HOOKS))}.")
        for name, function in hooks.items():
            if function is not None:
                setattr(self, name, function)
