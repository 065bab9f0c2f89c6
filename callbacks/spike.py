"""SpikeDetection: stop training with TrainingSpikeException when the loss jumps away from its recent mean, and
write the suspect batches to a JSON file (Lightning's callback, on a plain running mean)."""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from callbacks.base import Callback
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class TrainingSpikeException(RuntimeError):
    """SpikeDetection found a loss spike at a batch (its index is in the message)."""

    def __init__(self, batch_idx: int, *args: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args)
        self.batch_idx = batch_idx


class SpikeDetection(Callback):
    """Stop training when a training loss is a spike: not an improvement on the previous loss (`mode`), and away
    from the mean of the last `window` losses by at least `atol` and by at least `rtol` times that mean (a tolerance
    of None always passes); with `finite_only`, a NaN or infinite loss is a spike too. The batch and the one before
    it are written to `exclude_batches_path` (a JSON list, default `<default_root_dir>/skip_batches.json`) before
    TrainingSpikeException is raised, so a resumed run can skip them. Every rank checks its own loss; any rank's
    spike stops all (one agreed decision per batch).

    Args:
        mode: `"min"` (a loss) or `"max"` (a score): which direction is an improvement.
        window: how many recent losses the reference mean covers.
        warmup: batches (by index in the epoch) before spikes are looked for.
        atol: the least absolute distance from the mean that makes a spike (None: any).
        rtol: the least distance relative to the mean that makes a spike (None: any).
        exclude_batches_path: the JSON file (or the folder for `skip_batches.json`).
        finite_only: a non-finite loss is a spike (False: it is skipped, without counting in the mean).

    Attributes:
        bad_batches: the batch indices written to the file.
    """

    def __init__(self, mode: Literal["min", "max"] = "min", window: int = 10, warmup: int = 1,
                 atol: float | None = None, rtol: float | None = 2.0, exclude_batches_path: str | Path | None = None,
                 finite_only: bool = True) -> None:
        if mode not in ("min", "max"):
            raise ConfigError(f"SpikeDetection(mode={mode!r}): invalid mode, has to be 'min' or 'max'.")
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.bad_batches: list[int] = []
        self.last_val: float = 0.0
        self._recent: deque[float] = deque(maxlen=window)

    @torch.no_grad()
    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if isinstance(outputs, torch.Tensor):
            loss = outputs
        elif isinstance(outputs, Mapping) and "loss" in outputs:
            loss = outputs["loss"]
        else:
            raise TypeError(f"SpikeDetection reads the loss training_step returned: a tensor or a dict with 'loss', "
                            f"got {type(outputs).__qualname__}.")
        value = float(loss.detach())
        spike = trainer.strategy.reduce_boolean_decision(batch_idx >= self.warmup and self._is_spike(value),
                                                         all=False)
        if spike:
            self._handle_spike(trainer, batch_idx)
        if self.finite_only or trainer.strategy.reduce_boolean_decision(math.isfinite(value), all=True):
            self._recent.append(value)
            self.last_val = value

    def _is_spike(self, value: float) -> bool:
        if not math.isfinite(value):
            return self.finite_only
        change = value - self.last_val
        if (change <= 0) if self.mode == "min" else (change >= 0):
            return False  # an improvement on the previous loss is never a spike
        if not self._recent:
            return False
        mean = sum(self._recent) / len(self._recent)
        far = abs(value - mean)
        return (self.atol is None or far >= abs(self.atol)) and (self.rtol is None or far >= abs(self.rtol * mean))

    def _handle_spike(self, trainer: Trainer, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        path = os.fspath(self.exclude_batches_path or trainer.default_root_dir)
        if not path.endswith(".json"):
            path = os.path.join(path, "skip_batches.json")
        self.exclude_batches_path = path
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as handle:
                json.dump(self.bad_batches, handle, indent=4)
        raise TrainingSpikeException(batch_idx)

    def state_dict(self) -> dict[str, Any]:
        return {"last_val": self.last_val, "mode": self.mode, "warmup": self.warmup, "atol": self.atol,
                "rtol": self.rtol, "bad_batches": list(self.bad_batches),
                "bad_batches_path": None if self.exclude_batches_path is None else os.fspath(self.exclude_batches_path),
                "recent": list(self._recent)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_val = float(state_dict["last_val"])
        self.mode, self.warmup = state_dict["mode"], state_dict["warmup"]
        self.atol, self.rtol = state_dict["atol"], state_dict["rtol"]
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict.get("bad_batches_path")
        self._recent = deque(state_dict.get("recent", []), maxlen=self.window)
