"""The control plane: one small all-reduce at step boundaries, so that every rank takes the same branch.

Why: a rank that decides alone (to stop, that max_time is up, to skip a step, that its data ran out,
that its loss is NaN, which metrics to sync) leaves the others waiting in a collective it never joins,
until the process group times out 10-30 minutes later. Here each rank contributes its flags and all ranks act on the
reduced result. Flags are encoded as `rank + 1` (0 = not set) and reduced with MAX, so the result also
names a rank that set each one; a key-set hash travels as (h, -h) so MAX yields both max and -min.

The agreement of a step carries the stop signal, end of data (this rank's last batch, or none at all), max_time, a
time-based validation, a non-finite loss (terminate_on_nan) and the names of the sync_dist metrics that
`training_step` logged. In automatic optimization it is started right after `training_step` without waiting, and
waited for after backward, before the optimizer step and before those metrics are reduced: its latency hides behind
the backward, whose gradient all-reduce brings the ranks together anyway. The strategy carries that round
(`start_agree`): when every rank is on one machine and gloo carries the gradients, through shared memory
(strategies/comm/agreement_board.py), which wakes no gloo thread; otherwise as a gloo all-reduce. A rank whose data ran
out meets that round without a batch and raises; the others then lose it in the gradient all-reduce, find its
reason in the completed round (`explain_lost_peer`) and raise the same error.

One synchronous round after the step instead where backward must wait for it: a `training_step` whose code can
return None (trainer/ranks/step_returns.py), since whether any rank skips must be known before anyone starts backward;
and manual optimization, whose step runs its own backward. With one process it is a few attribute reads, no
tensor op.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from strategies.exceptions import DistributedDesyncError, MisconfigurationError, TrainerError
from trainer.ranks.step_clock import StepClock

if TYPE_CHECKING:
    from strategies.base import Strategy
    from strategies.comm.distributed import Pending
    from trainer.loops.fit_state import FitState
    from trainer.metrics.results import ResultCollection
    from trainer.ranks.preemption import StopSignals

# Slots of the step agreement vector. _DRY: this rank's data ended before this batch (it has no batch here).
# _VAL_TIME: a time val_check_interval passed on this rank.
_STOP, _SKIP, _NONFINITE, _LAST, _MORE, _KEYS, _NEG_KEYS, _TIME_UP, _DRY, _VAL_TIME = range(10)
_SIZE = 10


_EQUAL_COUNTS = ("Every rank must see the same number of batches: keep use_distributed_sampler=True, or make your "
                 "sampler/dataset yield equal counts per rank (drop_last, or pad), with a __len__ that matches what "
                 "it yields.")


class NonFiniteLossError(TrainerError, FloatingPointError):
    """The training loss was NaN or inf on some rank; every rank stops at the same step."""


def keys_hash(keys: Iterable[str]) -> int:
    """A hash of a set of metric names that is the same in every process (str hash() is salted)."""
    return zlib.crc32("\0".join(sorted(keys)).encode())


class ControlPlane:
    """Agrees on stop / skip / non-finite loss / end of data / synced metric names across ranks."""

    def __init__(self, every_n_steps: int, check_finite: bool, signals: StopSignals) -> None:
        self.every_n_steps = every_n_steps
        self.check_finite = check_finite
        self.signals = signals
        self.stop_signal = 0  # agreed signal number to stop on after this batch; 0 = keep going
        self._strategy: Any = None
        self._rank, self._world = 0, 1
        self._depth = 0  # nesting of outside_steps()
        self.clock = StepClock()  # times training batches at the agreements: the hang bound follows the run
        self.step_may_skip = True  # training_step can return None: one synchronous round (set per run)
        # The step's overlapped round in flight (round, keys, loss), waited for in after_backward; None when none
        # (always with one process), so the closure calls after_backward only when there is one.
        self.in_flight: tuple[Pending, list[str], Tensor | None] | None = None

    def start(self, strategy: Strategy) -> None:
        self._strategy = strategy
        self._rank, self._world = strategy.global_rank, strategy.world_size
        self.stop_signal = 0
        self._depth = 0
        self.in_flight = None
        self.clock.start(strategy)

    @contextmanager
    def outside_steps(self) -> Iterator[None]:
        """Around evaluation and checkpoint saves, where one rank may keep the others waiting for long (rank 0 writing
        a file): collectives get the process group's own timeout. On the way out, if the hang bound was in force, the
        ranks meet in one barrier (under that long timeout) and the bound applies again. Every rank enters it at the
        same point; on an exception nothing runs on the way out (no collective in a failure path)."""
        if self._world == 1:
            yield
            return
        self._depth += 1
        bounded = self._depth == 1 and self.clock.pause()
        try:
            yield
        finally:
            self._depth -= 1
        if bounded:
            self._strategy.barrier("ranks in step again: the hang bound applies")
            self.clock.resume()

    def epoch_ends(self) -> None:
        """From the end of a training epoch to the start of the next (epoch-end hooks, new data loaders): the process
        group's own timeout. `check_batch_counts` at the next epoch's start brings the ranks in step and the bound
        back."""
        if self._world > 1:
            self.clock.pause()

    def stop_signal_after_fit(self) -> int:
        """After the last training batch: a stop signal received since the last agreement (during the final
        validation or epoch end), agreed by every rank; 0 when none. One collective per fit."""
        if self._world == 1:
            return self.signals.received
        return self._strategy.agree([self.signals.received])[0]

    # --- once per step ------------------------------------------------------------------------------
    def _due(self, loop: FitState, is_last: bool) -> bool:
        return not loop.progress.total_batches % self.every_n_steps or is_last

    def after_training_step(self, loop: FitState, loss: Tensor | None, is_last: bool, can_skip: bool) -> bool:
        """Settle this step on every rank; returns True when every rank skips backward and the optimizer.

        Raises NonFiniteLossError or DistributedDesyncError on every rank at once: here after a synchronous round,
        from `after_backward` after an overlapped one (automatic optimization, a step that cannot return None).
        """
        if self._world == 1:
            if self.check_finite and loss is not None and not bool(torch.isfinite(loss.detach())):
                raise self._nonfinite(loop, self._rank, loss)
            self.stop_signal = self.signals.received
            return loss is None
        if not self._due(loop, is_last):
            loop.results.flush_sync()  # not due: ranks act on local knowledge (see docs/reliability.md)
            return loss is None
        if can_skip and not self.step_may_skip:
            self._start_overlapped(loop, loss, is_last)
            return False
        return self._agree_step(loop, loss, is_last, can_skip)

    def after_backward(self, loop: FitState) -> None:
        """Before the optimizer step: wait for the step's overlapped round (done by now: the gradient all-reduce
        brought the ranks together), act on it on every rank, then reduce the step's sync_dist metrics."""
        if self.in_flight is None:
            return
        pending, keys, loss = self.in_flight
        self.in_flight = None
        agreed = pending.wait()
        if agreed[_SKIP]:  # a None the step's code does not show, on a rank whose backward had no collective
            raise self._unannounced_skip(loop, agreed[_SKIP] - 1)
        self._settle(loop, agreed, keys, loss)

    def explain_lost_peer(self, loop: FitState) -> BaseException | None:
        """After a collective failed because a peer left or stopped answering: the reason that peer gave in this
        step's round, when the round completed (it ran out of data, or returned None it had not announced), so that
        every rank reports the cause instead of the lost contact. No collective."""
        pending, self.in_flight = self.in_flight, None
        if pending is None or not pending[0].done():
            return None
        try:
            agreed = pending[0].wait()
        except (RuntimeError, ValueError):  # the round itself failed with the peer: it left no reason
            return None
        try:
            self._check_data_left(loop, agreed)
            if agreed[_SKIP]:
                return self._unannounced_skip(loop, agreed[_SKIP] - 1)
        except DistributedDesyncError as err:
            return err
        return None

    def _known_flags(self, loop: FitState, flags: list[int], is_last: bool) -> None:
        me = self._rank + 1
        flags[_STOP] = self.signals.received
        flags[_LAST if is_last else _MORE] = me
        schedule = loop.schedule
        if schedule.time_up_here():
            flags[_TIME_UP] = me
        if schedule.val_time_due_here():
            flags[_VAL_TIME] = me

    def _known_after_step(self, loop: FitState, flags: list[int], loss: Tensor | None) -> list[str]:
        if self.check_finite and loss is not None and not bool(torch.isfinite(loss.detach())):
            flags[_NONFINITE] = self._rank + 1
        pending = loop.results.pending_sync_keys()
        flags[_KEYS] = h = keys_hash(pending)
        flags[_NEG_KEYS] = -h
        return pending

    def _start_overlapped(self, loop: FitState, loss: Tensor | None, is_last: bool) -> None:
        flags = [0] * _SIZE
        self._known_flags(loop, flags, is_last)
        if loss is None:  # the step's code has no path to None: the others are on their way to backward
            flags[_SKIP] = self._rank + 1
        keys = self._known_after_step(loop, flags, loss)
        self.in_flight = (self._strategy.start_agree(flags), keys, loss)
        if loss is None:
            raise self._unannounced_skip(loop, self._rank)

    def _settle(self, loop: FitState, agreed: list[int], keys: list[str], loss: Tensor | None) -> None:
        """Act on an agreed round, in the same order on every rank; raises what every rank must raise."""
        schedule = loop.schedule
        schedule.time_up_agreed = schedule.time_up_agreed or bool(agreed[_TIME_UP])  # max_time: on every rank at once
        schedule.val_time_agreed = bool(agreed[_VAL_TIME])  # a time val_check_interval: validate on every rank
        self.clock.agreed(loop.progress.total_batches)
        self._check_data_left(loop, agreed)  # first: a rank without a batch logged nothing, names would differ
        if agreed[_KEYS] != -agreed[_NEG_KEYS]:
            self._raise_key_mismatch(keys, "training_step")
        if agreed[_NONFINITE]:
            raise self._nonfinite(loop, agreed[_NONFINITE] - 1, loss)
        loop.results.flush_sync()
        self.stop_signal = agreed[_STOP]

    def _agree_step(self, loop: FitState, loss: Tensor | None, is_last: bool, can_skip: bool) -> bool:
        """One synchronous round after the step (a step that can return None; manual optimization)."""
        flags = [0] * _SIZE
        self._known_flags(loop, flags, is_last)
        if can_skip and loss is None:
            flags[_SKIP] = self._rank + 1
        keys = self._known_after_step(loop, flags, loss)
        agreed = self._strategy.agree(flags)
        self._settle(loop, agreed, keys, loss)
        return bool(agreed[_SKIP])

    def ran_dry(self, loop: FitState) -> None:
        """This rank's training data ended before the batch its loader announced (an IterableDataset empty here, a
        sampler whose __len__ overstates): it meets the other ranks at the agreement of the batch it does not have,
        so that every rank raises there instead of waiting in a collective this rank never joins. Several ranks
        ending together (all dry) is a shorter epoch, as a plain loop would have."""
        if self._world == 1:
            return
        flags = [0] * _SIZE
        flags[_STOP] = self.signals.received
        flags[_DRY] = self._rank + 1
        if loop.automatic and not self.step_may_skip:  # the others start an overlapped round: meet them in it
            agreed = self._strategy.start_agree(flags).wait()
        else:
            agreed = self._strategy.agree(flags)
        self._check_data_left(loop, agreed)
        self.stop_signal = agreed[_STOP]

    def _check_data_left(self, loop: FitState, agreed: list[int]) -> None:
        batch, epoch = loop.progress.epoch_batches, loop.progress.current_epoch
        has_batch = agreed[_MORE] or agreed[_LAST]
        if agreed[_DRY] and has_batch:
            raise DistributedDesyncError(
                f"rank {agreed[_DRY] - 1} has no training batch {batch} of epoch {epoch}: its data ended after "
                f"{batch} batch(es) (an IterableDataset that yields less on that rank, or a sampler whose __len__ "
                f"overstates what it yields), but rank {has_batch - 1} has that batch. "
                f"{_EQUAL_COUNTS}"
            )
        if agreed[_LAST] and agreed[_MORE]:
            raise DistributedDesyncError(
                f"rank {agreed[_LAST] - 1} ran out of training data at batch {batch} of epoch {epoch}, but rank "
                f"{agreed[_MORE] - 1} has more batches. {_EQUAL_COUNTS}"
            )

    def _unannounced_skip(self, loop: FitState, rank: int) -> MisconfigurationError:
        return MisconfigurationError(
            f"training_step returned None on rank {rank} at global step {loop.progress.global_step} (epoch "
            f"{loop.progress.current_epoch}, batch {loop.progress.epoch_batches}), but its code has no path that "
            "returns None, so the other ranks went on to backward without waiting for this rank (a step that can "
            "skip pays a synchronous agreement every step; one that cannot does not). Make the skip visible in "
            "training_step itself: `return None` (or a bare `return`) there, or in a method of your module that it "
            "returns the result of. See docs/reliability.md."
        )

    def _nonfinite(self, loop: FitState, rank: int, loss: Tensor | None) -> NonFiniteLossError:
        what = f"{loss.item()}" if loss is not None and rank == self._rank else "not finite"
        return NonFiniteLossError(
            f"the training loss on rank {rank} is {what} at global step {loop.progress.global_step} (epoch "
            f"{loop.progress.current_epoch}, batch {loop.progress.epoch_batches}); every rank stops here, before the "
            "optimizer step, so the weights and the last checkpoint are not touched by it. Lower the learning rate, "
            "clip gradients, or check the data of that batch."
        )

    # --- once per epoch / evaluation ------------------------------------------------------------------
    def check_batch_counts(self, count: int | float) -> None:
        """Before a training epoch: every rank must have the same number of batches (known lengths)."""
        if self._world == 1:
            return
        n = -1 if count == math.inf else int(count)
        agreed = self._strategy.agree([n, -n])
        if agreed[0] == -agreed[1]:
            self.clock.resume()  # every rank is here, in step: the hang bound applies again
            return
        counts = self._strategy.all_gather_object(n)  # every rank saw the mismatch: a lock-step collective
        shown = ", ".join(f"rank {r}: {'unknown' if c < 0 else c}" for r, c in enumerate(counts))
        raise DistributedDesyncError(
            f"the ranks have different numbers of training batches this epoch ({shown}); the rank with fewer "
            "would leave the others waiting in a collective. Keep use_distributed_sampler=True, or make your "
            "sampler give every rank the same count (drop_last=True, or pad), or set limit_train_batches."
        )

    def eval_batch_counts(self, count: int | float) -> list[int] | None:
        """Before each evaluation loader: None when every rank has the same known number of batches (always with
        one process), else each rank's count (-1: no length). Evaluation shards without padding, so the counts may
        differ; the steps that not every rank has are then joined by all (`reduce_eval_step`). One collective."""
        if self._world == 1:
            return None
        n = -1 if count == math.inf else int(count)
        agreed = self._strategy.agree([n, -n])
        return None if agreed[0] == -agreed[1] >= 0 else self._strategy.all_gather_object(n)

    def reduce_eval_step(self, results: ResultCollection, more: bool = False) -> bool:
        """A round of an evaluation whose ranks may have different numbers of steps: every rank joins, a rank that
        has run out with nothing to add. The per-step sync_dist values logged since the last round are reduced over
        the ranks that logged them (a mean over the ranks that have the step: no padded duplicate counts). `more`:
        this rank has a step after this one. Returns whether any rank has. One small all-reduce; the values travel
        only when some rank logged one."""
        pending = results.take_pending_sync()
        logged, more_anywhere = self._strategy.agree([int(bool(pending)), int(more)])
        if logged:
            sent = [(e.name, e.step_value.detach().cpu()) for e in pending if e.step_value is not None]
            values: dict[str, list[Tensor]] = {}
            for per_rank in self._strategy.all_gather_object(sent):
                for name, value in per_rank:
                    values.setdefault(name, []).append(value)
            for entry in pending:
                if entry.step_value is not None:
                    stacked = torch.stack(values[entry.name])
                    reduced = stacked.mean() if entry.reduce_fx == "mean" else getattr(stacked, entry.reduce_fx)()
                    entry.step_value = reduced.to(entry.step_value.device)
        return bool(more_anywhere)

    def check_sync_keys(self, keys: list[str], where: str) -> None:
        """Before reducing epoch metrics with sync_dist: every rank must reduce the same names, in order."""
        if self._world == 1:
            return
        h = keys_hash(keys)
        agreed = self._strategy.agree([h, -h])
        if agreed[0] != -agreed[1]:
            self._raise_key_mismatch(keys, where)

    def _raise_key_mismatch(self, keys: list[str], where: str) -> None:
        per_rank = self._strategy.all_gather_object(sorted(keys))  # all ranks are here: lock-step
        union = sorted(set().union(*per_rank))
        details = []
        for name in union:
            have = [r for r, ks in enumerate(per_rank) if name in ks]
            if len(have) != len(per_rank):
                missing = [r for r in range(len(per_rank)) if r not in have]
                details.append(f"metric {name!r} logged with sync_dist on ranks {have} but not {missing}")
        raise DistributedDesyncError(
            f"{'; '.join(details)} (in {where}). A value logged with sync_dist=True is reduced across ranks, so "
            "every rank must log it at the same point; log it on every rank, or use sync_dist=False for "
            "rank-local values."
        )
