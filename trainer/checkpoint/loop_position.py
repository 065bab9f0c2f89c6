"""Where the fit loop stands at the moment a checkpoint is taken, so that resuming from it continues
the run that was never interrupted. docs/checkpointing.md lists every place a checkpoint can come
from and what a resume from it continues; the rules, by what the loop was doing:

- between batches: after the last finished batch;
- a batch fetched, its backward not run yet (on_train_batch_start, training_step, on_before_zero_grad,
  on_before_backward):
  before that batch; the resumed run fetches and trains it again, from the torch RNG state and the
  logged epoch values it started with;
- its backward ran (on_after_backward, on_before_optimizer_step): after that batch, with its
  gradients; when that batch closes an accumulation window, the resumed run takes that step first;
- its optimizer step ran (in optimizer_step after the step, or a manual optimizer step): after that batch;
- a validation inside fit runs (on_validation_start ... on_validation_epoch_end): before it, so it
  runs again in full; from on_validation_end on it counts as done;
- the loop left an epoch before its end (max_steps, max_time, should_stop): the position at that
  moment, kept until training goes on; the epoch-end hooks that ran afterwards are not part of it.

The loop reports what it does to a LoopPosition; `saved_progress` turns the live counters into the
counters of that position. What the loop does per batch costs one torch RNG read (about 2 us).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import Tensor


class Phase(Enum):
    BETWEEN_BATCHES = "between_batches"
    BATCH_STARTED = "batch_started"  # fetched; backward not run
    BACKWARD_DONE = "backward_done"  # gradients added; the accumulation window stays open
    STEP_PENDING = "step_pending"  # gradients added; this batch's optimizer step has not run
    STEPPED = "stepped"  # the optimizer stepped; global_step not counted yet
    MANUAL_STEPPED = "manual_stepped"  # manual optimization stepped inside training_step (already counted)
    VALIDATING = "validating"


@dataclass
class LoopPosition:
    """What the fit loop is doing right now, as far as a checkpoint needs to know."""

    phase: Phase = Phase.BETWEEN_BATCHES
    epoch_start_rng: Tensor | None = None  # torch RNG when this epoch's data iterator was created
    batch_start: dict[str, Any] = field(default_factory=dict)  # torch RNG and sampler state before the fetch
    validation_rng: dict[str, Any] | None = None  # every RNG when the running validation began
    stopped: dict[str, Any] | None = None  # the checkpoint parts recorded when the loop left an epoch early

    def reset(self) -> None:
        self.phase, self.stopped, self.validation_rng = Phase.BETWEEN_BATCHES, None, None

    def before_fetch(self, sampler: Any) -> None:
        """The next batch is about to be fetched: what a checkpoint taken inside it rolls back to.

        The torch RNG states a batch draws from (CPU, and CUDA once it is in use): the same states as
        `torch.get_rng_state()` and `torch.cuda.get_rng_state_all()`, read from the generators themselves, because
        those wrappers re-check the device count and the CUDA context on every call (about 10-20 us of a host-bound
        GPU step, benchmarks/gpu.py's MLP). Reading the CPU generator's state (a 5 KB tensor) is most of what this
        costs per batch: about 8 k instructions. The sampler state is kept too: the first fetch of an epoch is where
        a RandomSampler draws its seed.
        """
        rng: dict[str, Any] = {"torch": torch.default_generator.get_state()}
        if torch.cuda.is_initialized():  # cheaper than is_available(), which asks the driver
            rng["cuda"] = [generator.get_state() for generator in torch.cuda.default_generators]
        self.batch_start = {"rng": rng, "sampler": dict(sampler.epoch_state) if sampler is not None else {}}

    def validation_started(self, rng: dict[str, Any]) -> None:
        self.phase, self.validation_rng = Phase.VALIDATING, rng

    def validation_finished(self) -> None:
        """From on_validation_end on, a checkpoint counts the validation as done (no-op outside fit)."""
        if self.phase is Phase.VALIDATING:
            self.phase, self.validation_rng = Phase.BETWEEN_BATCHES, None


# phase -> (the batch in flight counts as finished, optimizer steps to add)
_AFTER_BATCH = {Phase.BACKWARD_DONE: 0, Phase.STEP_PENDING: 0, Phase.STEPPED: 1, Phase.MANUAL_STEPPED: 0}


def saved_progress(position: LoopPosition, progress: dict[str, Any]) -> dict[str, Any]:
    """The loop counters of the position a checkpoint taken now resumes from (see the module docstring)."""
    saved = dict(progress)
    phase = position.phase
    if phase in _AFTER_BATCH:
        saved["epoch_batches"] += 1
        saved["total_batches"] += 1
        saved["global_step"] += _AFTER_BATCH[phase]
        saved["val_started"] = False  # the validation due after this batch has not run
    elif phase is Phase.BATCH_STARTED:
        saved["val_started"] = True  # the one due before this batch has
    elif phase is Phase.VALIDATING:
        saved["val_started"] = False
    return saved


def window_after(position: LoopPosition, window_has_loss: bool) -> tuple[bool, bool]:
    """(the accumulation window holds gradients, its optimizer step is still to run) at the saved position."""
    phase = position.phase
    if phase in (Phase.STEPPED, Phase.MANUAL_STEPPED):
        return False, False
    if phase is Phase.STEP_PENDING:
        return True, True
    if phase is Phase.BACKWARD_DONE:
        return True, False
    return window_has_loss, False


def rng_after(position: LoopPosition, now: dict[str, Any]) -> dict[str, Any]:
    """The RNG states a resume restores: those of the batch start or validation start it rolls back to."""
    if position.phase is Phase.BATCH_STARTED:
        return {**now, **position.batch_start.get("rng", {})}
    if position.phase is Phase.VALIDATING and position.validation_rng is not None:
        return position.validation_rng
    return now
