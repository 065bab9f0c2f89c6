"""Loop state the user can read (TrainerState) and the loop's progress counters (Progress)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class LightningEnum(str, Enum):
    """A string enum whose members equal their value in any letter case (`TrainerFn.FITTING == "FIT"`), as
    Lightning's enums do; `from_str` finds a member by its name or its value."""

    @classmethod
    def from_str(cls, value: str, source: str = "key") -> Any:
        """The member whose name (`source="key"`), value (`"value"`) or either (`"any"`, names first) is `value`,
        ignoring case; a ValueError lists the accepted ones."""
        if source not in ("key", "value", "any"):
            raise ValueError(f"source={source!r} is not valid: use 'key', 'value' or 'any'.")
        names = {name.lower(): member for name, member in cls.__members__.items()}
        values = {member.value.lower(): member for member in cls}
        for table in ([names] if source == "key" else [values] if source == "value" else [names, values]):
            if value.lower() in table:
                return table[value.lower()]
        accepted = [*(names if source != "value" else []), *(values if source != "key" else [])]
        raise ValueError(f"{value!r} is not a {cls.__name__}: expected one of {accepted}.")

    def __eq__(self, other: object) -> bool:
        other_value = other.value if isinstance(other, Enum) else other
        return isinstance(other_value, str) and self.value.lower() == other_value.lower()

    def __hash__(self) -> int:  # equal members and strings hash alike (a dict keyed by members takes the values)
        return hash(self.value.lower())


class TrainerFn(LightningEnum):
    """The entry point that is running: fit, validate, test or predict."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(LightningEnum):
    """The loop that is running: fit runs training, sanity checking and validation; the others their own."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        """Whether this stage runs an evaluation loop (validation, sanity check or test)."""
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str:
        """The stage's `*_dataloader` hook prefix: `val` for validation and sanity checking."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


class TrainerStatus(LightningEnum):
    """Whether the Trainer is being built, running, or has finished or been interrupted."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        """Whether the last run ended, finished or interrupted."""
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


@dataclass
class TrainerState:
    """What the Trainer is doing: `fn` (entry point), `stage` (current loop) and `status`."""

    fn: TrainerFn | None = None
    stage: RunningStage | None = None
    status: TrainerStatus = TrainerStatus.INITIALIZING

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """Whether the last run ended (finished or interrupted)."""
        return self.status.stopped


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
