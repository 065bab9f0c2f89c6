"""How long a collective may wait for a rank that does not join: the hang bound.

Why: torch's process-group default is 30 minutes (gloo; 10 for NCCL), so a hung rank leaves every other rank silent
for half an hour. A fixed short timeout is no answer either: a collective may legitimately wait for minutes while
rank 0 writes a large checkpoint or the ranks build their data loaders. So, unless the user fixes the timeout, the
bound follows the run: torch's default outside steady training (setup, the first batch of each epoch, evaluation,
checkpoint saves, teardown), and during training batches

    max(min_timeout, timeout_steps x the measured time per training batch)      (default: 2 min, 20 batches)

applied with torch's own per-group timeout (`torch.distributed.set_timeout`), so nothing runs per step: the trainer
measures the batch time at the agreements it already makes and re-applies the bound when it moves by more than 10 %.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from strategies.exceptions import ConfigError

DEFAULT_MIN_TIMEOUT_S = 120.0
DEFAULT_TIMEOUT_STEPS = 20
_RETUNE = 0.10  # re-apply the bound only when it moves by more than this fraction


def set_group_timeout(group: Any, timeout: timedelta) -> None:
    """Set the timeout of `group`'s future collectives (torch's `set_timeout`; `_set_pg_timeout` in older torch)."""
    setter = getattr(dist, "set_timeout", None)
    if setter is None:
        setter = dist.distributed_c10d._set_pg_timeout
    setter(timeout, group)


def torch_default_timeout(backend: str) -> timedelta:
    """The timeout torch gives a process group created without one."""
    from torch.distributed import constants

    # torch leaves the NCCL default unset (None) in builds without NCCL; such a group gets the generic one.
    nccl = constants.default_pg_nccl_timeout
    return nccl if backend == "nccl" and nccl is not None else constants.default_pg_timeout


def _seconds(name: str, value: Any) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ConfigError(f"{name}={value!r} is not valid: give a timedelta or a number of seconds > 0.")
    return float(seconds)


class CollectiveTimeout:
    """The hang rule of one strategy, and the bound applied to its process groups now.

    Args:
        fixed: the user's `timeout` (every collective, always); None means the adaptive rule.
        min_timeout: the adaptive bound's least value (seconds or timedelta); default 120 s.
        timeout_steps: the adaptive bound in measured training batches; default 20.
    """

    def __init__(self, fixed: timedelta | float | None, min_timeout: timedelta | float | None,
                 timeout_steps: int | None) -> None:
        if fixed is not None and (min_timeout is not None or timeout_steps is not None):
            raise ConfigError(
                f"timeout={fixed!r} fixes how long every collective waits, so min_timeout and timeout_steps (which "
                "shape the adaptive timeout used when timeout=None) would have no effect: remove them, or timeout."
            )
        self.fixed = timedelta(seconds=_seconds("timeout", fixed)) if fixed is not None else None
        self.min_s = _seconds("min_timeout", min_timeout) if min_timeout is not None else DEFAULT_MIN_TIMEOUT_S
        steps = DEFAULT_TIMEOUT_STEPS if timeout_steps is None else timeout_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"timeout_steps={timeout_steps!r} is not valid: it must be an int >= 1.")
        self.steps = steps
        self._groups: list[tuple[Any, timedelta]] = []
        self.applied_s: float | None = None  # the adaptive bound in force; None: the groups' own timeout
        self.step_s: float | None = None  # the batch time it came from

    def attach(self, groups: list[tuple[Any, timedelta]]) -> None:
        """The process groups to bound, each with the timeout it was created with (restored outside training)."""
        self._groups = groups
        self.applied_s = None

    def attach_more(self, groups: list[tuple[Any, timedelta]]) -> None:
        """More process groups to bound from now on (a device mesh's groups, made after the world's)."""
        self._groups = self._groups + groups
        self.applied_s = None

    def bound_for(self, step_s: float) -> float:
        return max(self.min_s, self.steps * step_s)

    def apply(self, step_s: float | None) -> bool:
        """Bound the groups for training batches of `step_s` seconds; None restores their own timeout. Returns False
        when the bound does not follow the step time (a fixed timeout, or no group)."""
        if self.fixed is not None or not self._groups:
            return False
        target = None if step_s is None else self.bound_for(step_s)
        applied = self.applied_s
        if target == applied or (target is not None and applied is not None
                                 and abs(target - applied) <= _RETUNE * applied):
            return True
        for group, own in self._groups:
            set_group_timeout(group, own if target is None else timedelta(seconds=target))
        self.applied_s, self.step_s = target, step_s
        return True

    def current_seconds(self) -> float | None:
        """How long a collective issued now may wait (None: unknown, no group attached)."""
        if self.fixed is not None:
            return self.fixed.total_seconds()
        if self.applied_s is not None:
            return self.applied_s
        return self._groups[0][1].total_seconds() if self._groups else None

    def describe(self) -> str:
        """The bound in force and where it comes from, for error messages."""
        if self.fixed is not None:
            return f"{self.fixed.total_seconds():g} s (DDPStrategy(timeout=...))"
        if self.applied_s is not None and self.step_s is not None:
            return (f"{self.applied_s:.3g} s (the hang bound: max(min_timeout={self.min_s:g} s, timeout_steps="
                    f"{self.steps} x {self.step_s:.3g} s measured per training batch))")
        own = self.current_seconds()
        shown = f"{own:g} s" if own is not None else "torch's default"
        return f"{shown} (torch's process-group default, in force outside steady training)"
