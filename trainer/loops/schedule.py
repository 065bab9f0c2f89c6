"""When things happen in fit: validation cadence, sanity steps, and every stop condition.

The loop asks ("is validation due?", "stop now?") and never computes moduli itself.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta

from strategies.comm.distributed import rank_zero_info
from trainer.setup.flags import RunSpec
from trainer.state import Progress


class FitSchedule:
    """Owns val_check_interval, check_val_every_n_epoch, the accumulation windows, max/min epochs, max_steps and
    max_time."""

    def __init__(self, spec: RunSpec, progress: Progress) -> None:
        self.spec = spec
        self.progress = progress
        # Batches per optimizer step: the flag, until a callback changes it at an epoch start
        # (GradientAccumulationScheduler); the windows are counted within each epoch, so a change takes effect there.
        self.accumulate_grad_batches: int = spec.accumulate_grad_batches
        self.num_training_batches: int | float = 0
        self.has_validation = False
        self._val_every: int | float = math.inf
        self._deadline: float | None = None
        self.clock_agreed = False  # several ranks: time is up when the step agreement says so
        self.time_up_agreed = False
        self.should_stop = False
        self._min_epochs_notice = False
        self.clock = time.monotonic  # read for max_time and a time val_check_interval (tests put a fake one here)
        self._last_val = 0.0  # when the fit started or the last validation ended (a time val_check_interval)
        self.val_time_agreed = False  # several ranks: the step agreement said a time val_check_interval passed

    def start(self, num_training_batches: int | float, has_validation: bool, world_size: int = 1) -> None:
        """Called once the train loader is known. With several ranks, max_time is decided by the step
        agreement (trainer/ranks/agreement.py): each rank's clock alone could stop one rank a batch before the
        others."""
        self.clock_agreed = world_size > 1
        self.time_up_agreed = False
        self.should_stop = False  # a new fit() goes on after an earlier one was stopped (as in Lightning)
        self._last_val, self.val_time_agreed = self.clock(), False
        self.set_batches(num_training_batches, has_validation)
        if self.spec.max_time is not None:
            self._deadline = self.clock() + self.spec.max_time.total_seconds()

    def set_batches(self, num_training_batches: int | float, has_validation: bool) -> None:
        """The epoch's batch count and whether there is validation: at the start, and again when the loaders are
        requested anew (`reload_dataloaders_every_n_epochs`) with a different length."""
        self.num_training_batches = num_training_batches
        self.has_validation = has_validation
        interval = self.spec.val_check_interval
        if isinstance(interval, timedelta):
            self._val_every = math.inf  # by the clock, not by batch counts
        elif isinstance(interval, float):
            self._val_every = (
                max(1, int(num_training_batches * interval)) if num_training_batches != math.inf else math.inf
            )
        else:
            self._val_every = interval

    @property
    def val_check_batch(self) -> int | float | None:
        """Training batches between two validations (`inf`: only at the epoch's end); None for a time interval."""
        return None if isinstance(self.spec.val_check_interval, timedelta) else self._val_every

    def validates_this_epoch(self) -> bool:
        """Whether the current epoch validates at all (`check_val_every_n_epoch`)."""
        every_n = self.spec.check_val_every_n_epoch
        return self.has_validation and (every_n is None or (self.progress.current_epoch + 1) % every_n == 0)

    def stop_validation_due(self) -> bool:
        """A stop the fit may take was requested (`should_stop`, e.g. from EarlyStopping): Lightning validates after
        that batch too, so the run ends validated."""
        return self.should_stop and self.validates_this_epoch() and self._stop_allowed()

    def val_due(self, batch_idx: int, is_last: bool) -> bool:
        """Validation runs after this training batch, by the validation schedule?"""
        if not self.validates_this_epoch():
            return False
        every_n = self.spec.check_val_every_n_epoch
        if isinstance(self.spec.val_check_interval, timedelta):
            return self._val_time_due(is_last)
        if isinstance(self.spec.val_check_interval, int) and every_n is None:
            return self.progress.total_batches % self.spec.val_check_interval == 0
        if self.spec.val_check_interval == 1.0 and is_last:
            return True
        return self._val_every != math.inf and (batch_idx + 1) % self._val_every == 0

    def _val_time_due(self, is_last: bool) -> bool:
        """Lightning's rule for a time interval: due once that much time passed since the fit started or the last
        validation ended (the end of an epoch alone does not make it due, except for data without a length).
        With several ranks the step agreement decided it (trainer/ranks/agreement.py), so that every rank validates
        after the same batch; between agreements (agree_every_n_steps > 1) it is not due."""
        if is_last and self.num_training_batches == math.inf:
            return True
        if self.clock_agreed:
            due, self.val_time_agreed = self.val_time_agreed, False
            return due
        return self.val_time_due_here()

    def val_time_due_here(self) -> bool:
        """This process's clock says a time val_check_interval passed (what a rank contributes to the agreement)."""
        interval = self.spec.val_check_interval
        return isinstance(interval, timedelta) and self.clock() - self._last_val >= interval.total_seconds()

    def validation_ran(self) -> None:
        """A validation inside fit ended: a time val_check_interval counts from now."""
        self._last_val, self.val_time_agreed = self.clock(), False

    def window_ends(self, batch_idx: int, is_last: bool) -> bool:
        """Does this training batch close its gradient-accumulation window (so the optimizer steps after it)?

        Every `accumulate_grad_batches`-th batch of the epoch, and the epoch's last batch, which closes a short window.
        """
        return is_last or (batch_idx + 1) % self.accumulate_grad_batches == 0

    def sanity_steps(self, val_batches: int | float) -> int | float:
        n = self.spec.num_sanity_val_steps
        return val_batches if n == -1 else min(n, val_batches)

    def time_up_here(self) -> bool:
        """This process's clock passed max_time (what a rank contributes to the step agreement)."""
        return self._deadline is not None and self.clock() >= self._deadline

    def _time_up(self) -> bool:
        return self.time_up_agreed if self.clock_agreed else self.time_up_here()

    def _stop_allowed(self) -> bool:
        return self.progress.current_epoch >= self.spec.min_epochs and self.progress.global_step >= self.spec.min_steps

    def _can_stop_early(self) -> bool:
        """Lightning's rule: a requested stop waits for min_epochs and min_steps (max_epochs/max_steps do not)."""
        if self._stop_allowed():
            return True
        if not self._min_epochs_notice:
            rank_zero_info(
                f"should_stop was set, but min_epochs={self.spec.min_epochs} / min_steps={self.spec.min_steps} is "
                "not reached; training continues."
            )
            self._min_epochs_notice = True
        return False

    def stop_in_epoch(self) -> bool:
        """Leave the current epoch after this batch?"""
        max_steps = self.spec.max_steps
        if max_steps != -1 and self.progress.global_step >= max_steps:
            return True
        if self._deadline is not None and self._time_up():
            self.should_stop = True
            return True
        return self.should_stop and self._can_stop_early()

    def limit_reached(self) -> str | None:
        """The max_epochs / max_steps limit the loop counters already reached (`max_steps=10`), or None."""
        p, spec = self.progress, self.spec
        if spec.max_steps != -1 and p.global_step >= spec.max_steps:
            return f"`max_steps={spec.max_steps}`"
        if spec.max_epochs != -1 and p.current_epoch >= spec.max_epochs:
            return f"`max_epochs={spec.max_epochs}`"
        return None

    def fit_done(self) -> bool:
        """Start no further epoch?"""
        if self.limit_reached() is not None:
            return True
        if self._time_up():
            return True
        return self.should_stop and self._can_stop_early()
