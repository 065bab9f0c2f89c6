"""The search behind `Tuner.scale_batch_size`: run a few steps at growing batch sizes until one runs out of memory.

Lightning 2.6's rules: start at `init_val`; `power` doubles after every success and, at the first out-of-memory
error after a success, settles on half the failing size; `binsearch` doubles until a failure, then bisects between
the last success and the failure, and finally takes `margin` off. The search stops at `max_trials` successful
trials, at `max_val`, or when the batch size reaches the length of the data set. Out of memory means what Lightning
recognises: CUDA's and cuDNN's out-of-memory errors and the CPU allocator's "can't allocate memory".

Each trial is a Trainer built from the user's flags (see trainer/tuner/tuning.py), running `steps_per_trial` steps with
the batch size set on the module, its hparams or the datamodule (where `batch_arg_name` is found: the loaders are
rebuilt from the `*_dataloader` hooks for every trial).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_info
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


def _only_message(error: BaseException) -> str:
    """The message of a RuntimeError raised with one string (how torch reports allocation failures), else ""."""
    if isinstance(error, RuntimeError) and len(error.args) == 1 and isinstance(error.args[0], str):
        return error.args[0]
    return ""


def is_cuda_out_of_memory(error: BaseException) -> bool:
    """CUDA could not allocate."""
    message = _only_message(error)
    return "CUDA" in message and "out of memory" in message


def is_cudnn_snafu(error: BaseException) -> bool:
    """cuDNN refused the configuration, which it also does when memory runs short."""
    return "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED." in _only_message(error)


def is_out_of_cpu_memory(error: BaseException) -> bool:
    """The CPU allocator could not allocate."""
    return "DefaultCPUAllocator: can't allocate memory" in _only_message(error)


def is_oom_error(error: BaseException) -> bool:
    """Whether `error` is one of the out-of-memory errors the search recovers from (Lightning's list, and torch's
    OutOfMemoryError of any device)."""
    return isinstance(error, torch.OutOfMemoryError) or is_cuda_out_of_memory(error) or is_cudnn_snafu(error) \
        or is_out_of_cpu_memory(error)


def free_memory() -> None:
    """Collect Python's garbage, then release the CUDA allocator's cached blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _has(obj: Any, name: str) -> bool:
    return name in obj if isinstance(obj, dict) else hasattr(obj, name)


class BatchSizeTarget:
    """Where the batch size lives: the first of the module's attribute, its hparams, the datamodule's attribute or
    hparams that has `name` (Lightning's lookup); setting it sets every place that has it."""

    def __init__(self, model: Any, datamodule: Any, name: str) -> None:
        self.name = name
        self._holders = [obj for obj in (model, getattr(model, "hparams", None), datamodule,
                                         getattr(datamodule, "hparams", None)) if obj is not None and _has(obj, name)]
        if not self._holders:
            raise ConfigError(f"scale_batch_size(batch_arg_name={name!r}): neither the module nor the datamodule (nor "
                              f"their hparams) has `{name}`; the loaders must read the batch size from there.")

    def get(self) -> int:
        holder = self._holders[0]
        return int(holder[self.name] if isinstance(holder, dict) else getattr(holder, self.name))

    def set(self, value: int) -> None:
        for holder in self._holders:
            if isinstance(holder, dict):
                holder[self.name] = value
            else:
                setattr(holder, self.name, value)


class DatasetLength(Callback):
    """Records the length of the data set the trial ran on (the search stops when the batch size reaches it)."""

    def __init__(self) -> None:
        self.length: int | None = None

    def _record(self, loaders: Any) -> None:
        loader = loaders[0] if isinstance(loaders, list) and loaders else loaders
        try:
            self.length = len(loader.dataset)
        except (AttributeError, TypeError):  # an iterable data set, or no loader
            self.length = None

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._record(trainer.fit_state.loaders.train)

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.training and not trainer.sanity_checking:
            self._record(trainer.fit_state.loaders.val)

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._record(trainer.fit_state.loaders.test)

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._record(trainer.fit_state.loaders.predict)


class Search:
    """One search: `trial()` runs the current size and says whether it fit in memory."""

    def __init__(self, target: BatchSizeTarget, run_trial: Callable[[], int | None], max_val: int) -> None:
        self.target, self.run_trial, self.max_val = target, run_trial, max_val
        self.dataset_length: int | None = None

    def trial(self) -> bool:
        free_memory()
        try:
            self.dataset_length = self.run_trial()
        except RuntimeError as error:
            if not is_oom_error(error):
                raise
            free_memory()
            return False
        return True

    def adjust(self, *, factor: float = 1.0, value: int | None = None, desc: str | None = None) -> tuple[int, bool]:
        """Lightning's `_adjust_batch_size`: the next size (capped at max_val) and whether it changed."""
        current = self.target.get()
        if self.dataset_length is not None and current >= self.dataset_length:
            rank_zero_info(f"The batch size {current} is greater or equal than the length of your dataset: "
                           f"{self.dataset_length}.")
            return current, False
        new = value if value is not None else int(current * factor)
        if new > self.max_val:
            new = self.max_val
        if desc:
            rank_zero_info(f"Batch size {current} {desc}, trying batch size {new}")
        self.target.set(new)
        return new, new != current


def run_power(search: Search, size: int, max_trials: int) -> int:
    any_success = False
    for index in range(max_trials):
        if size >= search.max_val:
            rank_zero_info(f"Reached the maximum batch size limit of {search.max_val}. Stopping search.")
            break
        if search.trial():
            if index + 1 >= max_trials:
                break
            size, changed = search.adjust(factor=2.0, desc="succeeded")
            if not changed:
                break
            any_success = True
        else:
            size, _ = search.adjust(factor=0.5, desc="failed")
            if any_success:
                break
    return size


def run_binsearch(search: Search, size: int, max_trials: int, margin: float) -> int:
    low, high, count, last_success = 1, None, 0, size
    while True:
        if size >= search.max_val:
            rank_zero_info(f"Reached the maximum batch size limit of {search.max_val}. Stopping search.")
            break
        if search.trial():
            last_success = size
            count += 1
            if count >= max_trials:
                size = last_success
                break
            low = size
            if high:
                if high - low <= 1:
                    break
                size, changed = search.adjust(value=(high + low) // 2, desc="succeeded")
            else:
                size, changed = search.adjust(factor=2.0, desc="succeeded")
            if not changed:
                break
        else:
            high = size
            size, _ = search.adjust(value=(high + low) // 2, desc="failed")
            if high - low <= 1:
                break
    if margin > 0 and (reduced := max(1, int(size * (1 - margin)))) != size:
        rank_zero_info(f"Applying margin of {margin:.1%}, reducing batch size from {size} to {reduced}")
        size = reduced
        search.target.set(size)
    return size
