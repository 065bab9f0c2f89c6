"""Measures the time per training batch, so that the hang bound follows the run (strategies/comm/collective_timeout.py).

Why here: the bound is "how long may a rank wait for another in a collective", and the honest yardstick is the run's
own pace. The clock reads the time only at the step agreements the ranks already make (trainer/ranks/agreement.py), on
windows of 1, 2, 4, ... 64 batches, and hands the strategy a new figure at the end of each window: no per-step
collective, no per-step host sync, nothing at all with one process.

Outside steady training (evaluation, checkpoint saves, epoch boundaries, where one rank may legitimately keep the
others waiting: rank 0 writing a file, every rank building its data loader) the trainer calls `pause()`: the strategy
restores the process group's own timeout. `resume()` re-applies the bound once the ranks are in step again (the
trainer makes sure of that with a collective under the long timeout), and the window starts again.
"""

from __future__ import annotations

import time
from typing import Any

_MAX_WINDOW = 64  # batches between two measurements once the run is steady


class StepClock:
    """Times training batches between agreements and tells the strategy (`bound_collectives`)."""

    def __init__(self) -> None:
        self._strategy: Any = None
        self.step_s: float | None = None  # the last measured time per training batch
        self._mark: tuple[float, int] | None = None  # (time, batches) at the start of the window
        self._next = 0  # the batch count at which the window ends
        self._window = 1
        self._paused = True

    def start(self, strategy: Any) -> None:
        self._strategy, self.step_s = strategy, None
        self._mark, self._next, self._window, self._paused = None, 0, 1, True

    def agreed(self, batches: int) -> None:
        """After an agreement; `batches` training batches had finished before this one. Cheap unless a window ends."""
        if batches < self._next:
            return
        now = time.monotonic()
        if self._mark is not None and batches > self._mark[1]:
            self.step_s = (now - self._mark[0]) / (batches - self._mark[1])
            self._window = min(self._window * 2, _MAX_WINDOW)
        if self.step_s is not None and (self._paused or self._mark is not None):
            self._paused = not self._strategy.bound_collectives(self.step_s)
        self._mark, self._next = (now, batches), batches + self._window

    def pause(self) -> bool:
        """Outside steady training: the process group's own timeout, a fresh window. True if the bound was in force."""
        self._mark, self._next, self._window = None, 0, 1
        if self._strategy is None or self._paused:
            return False
        self._strategy.bound_collectives(None)
        self._paused = True
        return True

    def resume(self) -> None:
        """Back in steady training, every rank in step: the bound from the last measurement (once there is one)."""
        self._mark, self._next, self._window = None, 0, 1
        if self._strategy is not None and self._paused and self.step_s is not None:
            self._paused = not self._strategy.bound_collectives(self.step_s)
