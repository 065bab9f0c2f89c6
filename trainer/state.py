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
    epoch; `epoch_finished` tells a resume whether to start the next epoch.
    """

    current_epoch: int = 0
    global_step: int = 0
    epoch_batches: int = 0
    total_batches: int = 0
    epoch_finished: bool = False
    val_started: bool = False  # validation due after the last finished batch has begun

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)
