"""The step router: the module every wrapper (DDP, DP, FSDP2) wraps, so that `training_step` & co. run through its
`forward`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from torch import nn


class StepRouter(nn.Module):
    """Routes `training_step` & co. through `forward`, so wrappers (DDP, DP, FSDP2) see every step.

    Calling `module.training_step()` on a wrapped model would skip the wrapper's gradient sync
    (the bug Lightning fixed in PR #17424 by monkeypatching forward); an explicit router avoids that.
    The precision context is entered here, not in the caller: DP runs forward in worker threads and
    autocast state is thread-local.
    """

    def __init__(self, module: nn.Module, forward_context: Callable[[], AbstractContextManager] | None) -> None:
        super().__init__()
        self.module = module
        self._forward_context = forward_context  # None: the precision has none (32-true), no `with` per step
        self.__dict__["_target"] = module  # plain attribute: skips nn.Module.__getattr__ on the hot path

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        context = self._forward_context
        if context is None:
            return getattr(self._target, method)(*args, **kwargs)
        with context():
            return getattr(self._target, method)(*args, **kwargs)
