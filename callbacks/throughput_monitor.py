"""ThroughputMonitor: Lightning's callback that logs batches, samples (and items, FLOPs) per second.

Each stage (`train`, `validate`, `test`, `predict`) keeps running totals (time since the stage started, batches,
samples from `batch_size_fn`, items from `length_fn`) and logs them with the rates over the last `window_size`
updates, under Lightning's names: `train/time`, `train/batches`, `train/samples`, `train/lengths`,
`train/device/batches_per_sec`, `train/device/samples_per_sec`, `train/device/items_per_sec`, and, with several
processes, the world's `train/batches_per_sec`, `train/samples_per_sec`, `train/items_per_sec` (the device rate
times the world size). A module with a `flops_per_batch` attribute adds `device/flops_per_sec` (and the world's
`flops_per_sec`). Training logs when an optimizer step ends on the log cadence (callbacks/log_cadence.py),
evaluation every `log_every_n_steps`-th batch; only global rank 0 measures and logs, as in Lightning.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from callbacks.log_cadence import LogCadence
from strategies.comm.distributed import rank_zero_warn

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

_THROUGHPUT_ARGS = ("window_size", "separator")


def measure_flops(model: torch.nn.Module, forward_fn: Callable[[], torch.Tensor],
                  loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> int:
    """The FLOPs torch's FlopCounterMode counts in `forward_fn()` (with `loss_fn`, in the loss and its backward too):
    what a module's `flops_per_batch` should hold. Build the model on the meta device to count without computing.

    Example:
        ```python
        with torch.device("meta"):
            model, x = Net(), torch.randn(32, 128)
        flops_per_batch = measure_flops(model, lambda: model(x), lambda y: y.sum())
        ```
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()
    return counter.get_total_flops()


class Throughput:
    """Running totals and the rates over the last `window_size` updates (Lightning's `Throughput`, without the
    per-chip peak-FLOPs table: `device/mfu` needs `available_flops`, which the callback does not know)."""

    def __init__(self, world_size: int = 1, window_size: int = 100, separator: str = "/",
                 available_flops: float | None = None) -> None:
        if window_size < 2:
            raise ValueError(f"ThroughputMonitor(window_size={window_size}): the rates need a window of at least 2.")
        self.world_size, self.window_size, self.separator = world_size, window_size, separator
        self.available_flops = available_flops
        self.time: deque[float] = deque(maxlen=window_size)
        self.batches: deque[int] = deque(maxlen=window_size)
        self.samples: deque[int] = deque(maxlen=window_size)
        self.lengths: deque[int] = deque(maxlen=window_size)
        self.flops: deque[float] = deque(maxlen=window_size)

    def reset(self) -> None:
        for window in (self.time, self.batches, self.samples, self.lengths, self.flops):
            window.clear()

    def update(self, *, time: float, batches: int, samples: int, lengths: int | None = None,
               flops: float | None = None) -> None:
        """Totals so far (each must grow); `flops` is this update's FLOPs on one device."""
        if samples < batches:
            raise ValueError(f"ThroughputMonitor: {samples} samples in {batches} batches; batch_size_fn must count "
                             "at least one sample per batch.")
        if lengths is not None and lengths < samples:
            raise ValueError(f"ThroughputMonitor: {lengths} items in {samples} samples; length_fn must count at "
                             "least one item per sample.")
        for window, value in ((self.time, time), (self.batches, batches), (self.samples, samples)):
            if window and window[-1] >= value:
                raise ValueError(f"ThroughputMonitor: totals must increase, got {value} after {window[-1]}.")
        self.time.append(time)
        self.batches.append(batches)
        self.samples.append(samples)
        if lengths is not None:
            self.lengths.append(lengths)
        if flops is not None:
            self.flops.append(flops * self.world_size)

    def compute(self) -> dict[str, float]:
        sep, world = self.separator, self.world_size
        metrics: dict[str, float] = {"time": self.time[-1], "batches": self.batches[-1], "samples": self.samples[-1]}
        if self.lengths:
            metrics["lengths"] = self.lengths[-1]
        if len(self.time) == self.window_size:
            elapsed = self.time[-1] - self.time[0]
            rates = {"batches_per_sec": (self.batches[-1] - self.batches[0]) / elapsed,
                     "samples_per_sec": (self.samples[-1] - self.samples[0]) / elapsed}
            if len(self.lengths) == self.window_size:
                rates["items_per_sec"] = (self.lengths[-1] - self.lengths[0]) / elapsed
            for name, rate in rates.items():
                metrics[f"device{sep}{name}"] = rate
                if world > 1:
                    metrics[name] = rate * world
        if len(self.flops) == self.window_size:
            per_sec = (sum(self.flops) - self.flops[0]) / (self.time[-1] - self.time[0])
            if world > 1:
                metrics["flops_per_sec"] = per_sec
            metrics[f"device{sep}flops_per_sec"] = per_sec / world
            if self.available_flops:
                metrics[f"device{sep}mfu"] = per_sec / world / self.available_flops
        return metrics


class _Stage:
    """One stage's clock, totals and rate window."""

    def __init__(self, throughput: Throughput) -> None:
        self.throughput = throughput
        self.t0 = 0.0
        self.batches = self.samples = self.lengths = 0
        self.counted = False  # totals started: evaluation outside fit keeps counting across calls


_FIRST_STAGE = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}


class ThroughputMonitor(Callback):
    """Log throughput to the Trainer's loggers (Lightning's names, cadence and steps).

    Args:
        batch_size_fn: the number of samples in a batch, e.g. `lambda batch: batch[0].size(0)`.
        length_fn: the number of items (e.g. tokens) in a batch; adds `lengths` and `items_per_sec`.
        **kwargs: `window_size` (updates the rates are averaged over, default 100) and `separator` (default "/").

    Example:
        ```python
        monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0))
        trainer = Trainer(max_steps=1000, log_every_n_steps=10, callbacks=[monitor])
        ```
    """

    def __init__(self, batch_size_fn: Callable[[Any], int], length_fn: Callable[[Any], int] | None = None,
                 **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(_THROUGHPUT_ARGS))
        if unknown:
            raise TypeError(f"ThroughputMonitor got unknown argument(s) {unknown}; it takes "
                            f"{', '.join(_THROUGHPUT_ARGS)} besides batch_size_fn and length_fn.")
        Throughput(**kwargs)  # a bad window size is an error now, not at fit start
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.kwargs = kwargs
        self.available_flops: float | None = None  # a device's peak FLOP/s: set it to get `device/mfu` (no table)
        self._stages: dict[str, _Stage] = {}
        self._eval_steps: dict[tuple[str, str], int] = {}
        self._cadence = LogCadence()
        self._warned_flops = False

    # --- bookkeeping ------------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Fresh rate windows for the stages this run has (fit: training and validation); the totals of an
        evaluation stage carry over from an earlier run, as in Lightning."""
        for name in ("train", "validate") if stage == "fit" else (_FIRST_STAGE[stage],):
            throughput = Throughput(world_size=trainer.world_size, available_flops=self.available_flops,
                                    **self.kwargs)
            if name in self._stages:
                self._stages[name].throughput = throughput
            else:
                self._stages[name] = _Stage(throughput)

    def _start(self, trainer: Trainer, stage: str) -> None:
        state = self._stages[stage]
        if _fn(trainer) == "fit" or not state.counted:
            state.throughput.reset()
            state.batches = state.samples = state.lengths = 0
            state.counted = True
        state.t0 = time.perf_counter()

    @torch.inference_mode()  # batch_size_fn / length_fn may compute with tensors that need no graph
    def _update(self, trainer: Trainer, pl_module: TrainModule, batch: Any, stage: str) -> _Stage:
        state = self._stages[stage]
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # kernels still running would not be in the time
        elapsed = time.perf_counter() - state.t0
        if self.length_fn is not None:
            state.lengths += self.length_fn(batch)
        state.samples += self.batch_size_fn(batch)
        state.batches += 1
        state.throughput.update(time=elapsed, batches=state.batches, samples=state.samples,
                                lengths=state.lengths if self.length_fn is not None else None,
                                flops=self._flops(pl_module))
        return state

    def _flops(self, pl_module: TrainModule) -> float | None:
        flops = getattr(pl_module, "flops_per_batch", None)
        if flops is not None:
            return float(flops)
        if not self._warned_flops:
            self._warned_flops = True
            rank_zero_warn(f"ThroughputMonitor: define a `flops_per_batch` attribute or property on "
                           f"{type(pl_module).__name__} to log FLOPs per second.")
        return None

    def _log(self, trainer: Trainer, state: _Stage, stage: str, step: int, epoch: bool) -> None:
        sep = state.throughput.separator
        values = {f"{stage}{sep}{name}": value for name, value in state.throughput.compute().items()}
        if epoch:
            values["epoch"] = trainer.current_epoch
        trainer.metrics_router.send_computed(values, step=step)

    # --- training ---------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.is_global_zero:
            self._start(trainer, "train")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_steps.pop(("fit", "validate"), None)  # Lightning counts validation batches per training epoch

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._cadence.train_batch_started(trainer, pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not trainer.is_global_zero:
            return
        state = self._update(trainer, pl_module, batch, "train")
        window_closes = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or \
            batch_idx + 1 >= trainer.num_training_batches
        if window_closes and self._cadence.train_due(trainer):  # the optimizer step's time is in
            self._log(trainer, state, "train", trainer.metrics_router.logging_step, epoch=True)

    # --- evaluation -------------------------------------------------------------------------------------------
    def _eval_start(self, trainer: Trainer, stage: str) -> None:
        self._cadence.eval_run_started()
        if trainer.is_global_zero:
            self._start(trainer, stage)

    def _eval_batch_end(self, trainer: Trainer, pl_module: TrainModule, batch: Any, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        state = self._update(trainer, pl_module, batch, stage)
        key = (_fn(trainer), stage)  # Lightning's `batch_progress.total.ready` of the loop: the rows' step
        self._eval_steps[key] = self._eval_steps.get(key, 0) + 1
        if self._cadence.eval_due(trainer):
            self._log(trainer, state, stage, self._eval_steps[key], epoch=False)

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.sanity_checking:
            self._eval_start(trainer, "validate")

    def on_validation_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._cadence.eval_batch_started()

    def on_validation_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            self._eval_batch_end(trainer, pl_module, batch, "validate")

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Move the training clock past the validation, so that its time does not count as training time."""
        if trainer.sanity_checking or _fn(trainer) != "fit" or not trainer.is_global_zero:
            return
        train, val = self._stages["train"], self._stages["validate"]
        train_elapsed = train.throughput.time[-1] if train.throughput.time else 0.0
        val_elapsed = val.throughput.time[-1] if val.throughput.time else 0.0
        gap = val.t0 - (train.t0 + train_elapsed)
        train.t0 += gap + val_elapsed

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer, "test")

    def on_test_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._cadence.eval_batch_started()

    def on_test_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, pl_module, batch, "test")

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer, "predict")

    def on_predict_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        self._cadence.eval_batch_started()

    def on_predict_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, pl_module, batch, "predict")


def _fn(trainer: Trainer) -> str:
    fn = trainer.state.fn
    return str(getattr(fn, "value", fn))
