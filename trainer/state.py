"""Loop state the user can read (TrainerState) and the loop's progress counters (Progress)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class TrainerFn(str, Enum):
    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(str, Enum):
    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class TrainerStatus(str, Enum):
    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"


@dataclass
class TrainerState:
    """What the Trainer is doing: `fn` (entry point), `stage` (current loop) and `status`."""

    fn: TrainerFn | None = None
    stage: RunningStage | None = None
    status: TrainerStatus = TrainerStatus.INITIALIZING

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED


@dataclass
class Progress:
    """Counters that define where the fit loop is; saved in checkpoints to resume.

    `global_step` counts optimizer steps; `epoch_batches` counts batches finished in the current
    epoch; `epoch_opened` says the epoch's data iterator exists (its order is fixed, so a resume
    replays it even before its first batch finished); `epoch_finished` tells a resume whether to
    start the next epoch.
    """

    current_epoch: int = 0
    global_step: int = 0
    epoch_batches: int = 0
    total_batches: int = 0
    stepped_batches: int = 0  # batches that closed an accumulation window: the `log_every_n_steps` count
    epoch_finished: bool = False
    val_started: bool = False  # validation due after the last finished batch has begun
    epoch_opened: bool = False

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)
        if "stepped_batches" not in state:  # written before the counter existed: one optimizer, no skipped steps
            self.stepped_batches = self.global_step
        if "epoch_opened" not in state:  # written before the flag existed: an epoch was open once a batch finished
            self.epoch_opened = self.epoch_batches > 0 and not self.epoch_finished

    def settle(self) -> None:
        """Start a new fit() at an epoch boundary, keeping the counters of the last one (as Lightning does)."""
        if self.epoch_finished:
            self.current_epoch += 1
        self.epoch_batches = 0
        self.epoch_finished = self.val_started = self.epoch_opened = False
