"""Timer: Lightning's callback that measures the time spent per stage and stops training after `duration`.

`Trainer(max_time=...)` does the same through the loop's own clock; the Timer adds the per-stage clocks a script can
read (`time_elapsed("train")`, `start_time("validate")`, ...) and keeps the training time in the checkpoint, so a
resumed run stops when the total training time, across runs, reaches the duration (as in Lightning).
"""

from __future__ import annotations

import time
from datetime import timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_info
from strategies.durations import parse_duration
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

_STAGES = ("train", "sanity_check", "validate", "test", "predict")


class Interval(str, Enum):
    """When the Timer checks the time (Lightning's enum; the plain strings work too: `Interval.step == "step"`)."""

    step = "step"
    epoch = "epoch"


class Timer(Callback):
    """Stop training once it has run for `duration` ("DD:HH:MM:SS", a timedelta or a dict of its arguments),
    checked after every training batch (`interval="step"`) or epoch (`"epoch"`); None only measures.

    Example:
        ```python
        timer = Timer(duration="00:12:00:00")
        trainer = Trainer(callbacks=[timer])
        trainer.fit(model)
        print(timer.time_elapsed("train"), timer.time_elapsed("validate"))
        ```
    """

    def __init__(self, duration: str | timedelta | dict[str, int] | None = None, interval: str = "step",
                 verbose: bool = True) -> None:
        if interval not in ("step", "epoch"):
            raise ConfigError(f"Timer(interval={interval!r}): Unsupported parameter value; use 'step' or 'epoch'.")
        parsed = parse_duration(duration, "Timer(duration)")
        self._duration = parsed.total_seconds() if parsed is not None else None
        self._interval = interval
        self._verbose = verbose
        self._start: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._end: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._offset = 0.0  # training time of the runs before a resume

    # --- Lightning's clock API -----------------------------------------------------------------------------
    def start_time(self, stage: str = "train") -> float | None:
        return self._start[_stage(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        return self._end[_stage(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in `stage` ("train" includes the runs before a resume)."""
        stage = _stage(stage)
        start, end = self._start[stage], self._end[stage]
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = "train") -> float | None:
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # --- hooks --------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._start["train"], self._end["train"] = time.monotonic(), None

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._end["train"] = time.monotonic()

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._start["validate"], self._end["validate"] = time.monotonic(), None

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._end["validate"] = time.monotonic()

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._start["test"], self._end["test"] = time.monotonic(), None

    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._end["test"] = time.monotonic()

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._start["predict"], self._end["predict"] = time.monotonic(), None

    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._end["predict"] = time.monotonic()

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._check(trainer)

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._interval == "epoch":
            self._check(trainer)

    def _check(self, trainer: Trainer) -> None:
        """Ask to stop when the time is up. Each rank asks by its own clock; the loop's per-step agreement makes
        every rank stop after the same batch (no broadcast needed)."""
        if self._duration is None or trainer.should_stop or self.time_elapsed("train") < self._duration:
            return
        trainer.should_stop = True
        if self._verbose:
            elapsed = timedelta(seconds=int(self.time_elapsed("train")))
            rank_zero_info(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")

    # --- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in _STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", {}).get("train", 0.0))


def _stage(stage: str) -> str:
    value = getattr(stage, "value", stage)
    if value not in _STAGES:
        raise ValueError(f"Timer: unknown stage {stage!r}; use one of {', '.join(_STAGES)}.")
    return value
