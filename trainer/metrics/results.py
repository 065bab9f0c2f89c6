"""`self.log` bookkeeping: on_step/on_epoch per hook, batch-size-weighted epoch means, sync_dist,
torchmetrics objects. Cheap on the hot path: a step value is stored as a detached tensor and only
turned into a Python number when a logger or the progress bar reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from strategies.exceptions import MisconfigurationError

# hook → (default on_step, default on_epoch, on_step allowed). Hooks not listed may not log.
_STEP_HOOK = (True, False, True)
_EVAL_HOOK = (False, True, True)
_EPOCH_HOOK = (False, True, False)
LOGGING_HOOKS: dict[str, tuple[bool, bool, bool]] = {
    **dict.fromkeys(
        ("training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward",
         "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "optimizer_step",
         "optimizer_zero_grad", "backward", "configure_gradient_clipping"), _STEP_HOOK),
    **dict.fromkeys(
        ("validation_step", "test_step", "on_validation_batch_start", "on_validation_batch_end",
         "on_test_batch_start", "on_test_batch_end"), _EVAL_HOOK),
    **dict.fromkeys(
        ("on_train_start", "on_train_epoch_start", "on_train_epoch_end", "on_validation_start",
         "on_validation_epoch_start", "on_validation_epoch_end", "on_test_start", "on_test_epoch_start",
         "on_test_epoch_end"), _EPOCH_HOOK),
}
_REDUCE_FX = ("mean", "sum", "max", "min")


def _is_metric(value: Any) -> bool:
    """A torchmetrics.Metric, detected without importing torchmetrics. A tensor, the common value, is ruled out first:
    `hasattr` of a name a tensor lacks raises and catches an AttributeError inside (a few thousand instructions)."""
    return not isinstance(value, Tensor) and hasattr(value, "compute") and hasattr(value, "update") and hasattr(
        value, "reset")


def extract_batch_size(batch: Any) -> int | None:
    """The size of dim 0 of the first tensor found in the batch (Lightning's inference rule)."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim > 0 else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = extract_batch_size(item)
            if size is not None:
                return size
    return None


@dataclass
class _Entry:
    """One logged key within one loop (train, validate, ...)."""

    name: str
    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    sync_dist: bool
    reduce_fx: str
    step_value: Tensor | None = None
    total: Tensor | None = None
    weight: float = 0.0
    metric: Any = None
    pending: bool = False  # logged since the last epoch_end
    alias_step: bool = False  # callback_metrics[name] shows the step value until the epoch value exists
    suffix: str = ""  # "/dataloader_idx_N" when `name` ends with it: the forked keys put it last, as Lightning's
    dataloader_idx: int | None = None  # the loader it was logged for (several evaluation loaders), also unsuffixed

    def update_epoch(self, value: Tensor, batch_size: int) -> None:
        if self.reduce_fx == "mean":
            weighted = value * batch_size
            self.total = weighted if self.total is None else self.total + weighted
            self.weight += batch_size
        elif self.reduce_fx == "sum":
            self.total = value if self.total is None else self.total + value
        elif self.total is None:
            self.total = value
        else:
            pick = torch.maximum if self.reduce_fx == "max" else torch.minimum
            self.total = pick(self.total, value)

    def compute_epoch(self, reduce: Callable[[Tensor, str], Tensor]) -> Tensor | None:
        if self.metric is not None:  # reset later, after the epoch-end hooks (ResultCollection.reset_metric_objects)
            value = self.metric.compute()
            return value.detach() if isinstance(value, Tensor) else torch.tensor(float(value))
        if self.total is None:
            return None
        if self.reduce_fx == "mean":
            total, weight = self.total, torch.tensor(self.weight, dtype=self.total.dtype, device=self.total.device)
            if self.sync_dist:
                total, weight = reduce(total, "sum"), reduce(weight, "sum")
            return total / weight
        return reduce(self.total, self.reduce_fx) if self.sync_dist else self.total

    def step_key(self) -> str:
        return self._forked("_step") if self.on_epoch else self.name

    def epoch_key(self) -> str:
        return self._forked("_epoch") if self.on_step else self.name

    def _forked(self, tail: str) -> str:
        """`loss_step/dataloader_idx_1` for `loss` logged in the second of several loaders (Lightning's key)."""
        base = self.name[: len(self.name) - len(self.suffix)]
        return f"{base}{tail}{self.suffix}"


class ResultCollection:
    """What one loop (train, validate, test) logged. The Trainer keeps one per stage."""

    def __init__(self, reduce: Callable[[Tensor, Any], Tensor],
                 check_keys: Callable[[list[str], str], None] | None = None) -> None:
        self._reduce = reduce
        self._check_keys = check_keys  # control plane: every rank reduces the same names (trainer/ranks/agreement.py)
        self.defer_sync = False  # training_step's sync_dist step values wait for the step agreement
        self._pending_sync: list[_Entry] = []
        # Evaluation shards may hold different batch counts (trainer/ranks/agreement.py): in the steps not every rank
        # may have, per-step sync_dist values wait for a reduction that every rank joins.
        self.defer_eval_sync = False
        self.entries: dict[str, _Entry] = {}
        self.current_fx: str | None = None
        self.key_suffix = ""
        self.dataloader_idx: int | None = None  # the evaluation loader running, with several
        self.output_loaders: dict[str, int | None] = {}  # epoch output key -> the loader it belongs to (None: all)
        self._loader_of: dict[str, str] = {}  # name logged with add_dataloader_idx=False → its loader
        self._batch: Any = None
        self._batch_size: int | None = None
        self._before_batch: dict[str, dict[str, Any] | None] = {}  # entry fields before this batch changed them
        self._lock = threading.Lock()  # DP runs steps in threads over shallow module replicas

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_lock=None, _batch=None, _check_keys=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def set_batch(self, batch: Any) -> None:
        self._batch, self._batch_size = batch, None
        self._before_batch = {}

    def log(
        self, name: str, value: Any, on_step: bool | None, on_epoch: bool | None, prog_bar: bool, logger: bool,
        sync_dist: bool, reduce_fx: str, batch_size: int | None, add_dataloader_idx: bool = True,
    ) -> None:
        step, epoch = self._cadence(name, on_step, on_epoch)
        if reduce_fx not in _REDUCE_FX:
            raise MisconfigurationError(f"self.log({name!r}, reduce_fx={reduce_fx!r}): use one of {_REDUCE_FX}.")
        name_key = name + self.key_suffix if add_dataloader_idx else self._unsuffixed(name)
        # one entry per hook and name, as Lightning keeps them: a name logged in training_step and again in
        # on_train_epoch_end gives a step value and an epoch value, the later one shown where both have a key
        key = f"{self.current_fx}.{name_key}"
        with self._lock:
            entry = self.entries.get(key)
            if key not in self._before_batch:  # a checkpoint taken inside this batch rolls back to it
                self._before_batch[key] = None if entry is None else dict(vars(entry))
            if entry is None:
                suffix = self.key_suffix if add_dataloader_idx else ""
                entry = self.entries[key] = _Entry(name_key, step, epoch, prog_bar, logger, sync_dist, reduce_fx,
                                                   suffix=suffix, dataloader_idx=self.dataloader_idx)
            entry.pending = True
            entry.alias_step = step
            if _is_metric(value):
                entry.metric = value
                cached = getattr(value, "_forward_cache", None)
                if step and isinstance(cached, Tensor):
                    entry.step_value = cached.detach()
                return
            value = self._as_tensor(name, value)
            if step:
                self._set_step_value(entry, value, sync_dist, reduce_fx)
            if epoch:
                entry.update_epoch(value, self._infer_batch_size(name, batch_size, reduce_fx))

    def _unsuffixed(self, name: str) -> str:
        """The key of a value logged with add_dataloader_idx=False: its name, which one loader only may use (as in
        Lightning, which refuses the same name from a second loader instead of mixing the loaders' values)."""
        first = self._loader_of.setdefault(name, self.key_suffix)
        if first != self.key_suffix:
            raise MisconfigurationError(
                f"self.log({name!r}, add_dataloader_idx=False) was called for two dataloaders "
                f"({first.lstrip('/') or 'the first'} and {self.key_suffix.lstrip('/')}); give each dataloader its own "
                "name, or keep add_dataloader_idx=True (which appends /dataloader_idx_N)."
            )
        return name

    def _cadence(self, name: str, on_step: bool | None, on_epoch: bool | None) -> tuple[bool, bool]:
        """(on_step, on_epoch) for a value logged in the current hook: its defaults, or an error where not allowed."""
        fx = self.current_fx
        rules = LOGGING_HOOKS.get(fx) if fx is not None else None
        if rules is None:
            where = f"in {fx!r}" if fx else "outside the Trainer's hooks"
            raise MisconfigurationError(
                f"self.log({name!r}) was called {where}, where logging is not supported. "
                f"Log from training_step, validation_step, test_step or the batch/epoch hooks: {sorted(LOGGING_HOOKS)}."
            )
        step = rules[0] if on_step is None else on_step
        epoch = rules[1] if on_epoch is None else on_epoch
        if step and not rules[2]:
            raise MisconfigurationError(
                f"self.log({name!r}, on_step=True) is not allowed in {fx!r}: it runs once per epoch."
            )
        if not (step or epoch):
            raise MisconfigurationError(f"self.log({name!r}) with on_step=False and on_epoch=False logs nothing.")
        return step, epoch

    def _set_step_value(self, entry: _Entry, value: Tensor, sync_dist: bool, reduce_fx: str) -> None:
        """The step value: synced now, or later in one collective (training_step with deferred sync: after the
        step; an evaluation with uneven shards: over the ranks that have the step)."""
        if sync_dist and (self.defer_eval_sync or (self.defer_sync and self.current_fx == "training_step")):
            entry.step_value = value
            self._pending_sync.append(entry)
        else:
            entry.step_value = self._reduce(value, reduce_fx) if sync_dist else value

    @staticmethod
    def _as_tensor(name: str, value: Any) -> Tensor:
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise MisconfigurationError(
                    f"self.log({name!r}) got a tensor of shape {tuple(value.shape)}; log a scalar (one element)."
                )
            value = value.detach() if value.dim() == 0 else value.detach().reshape(())
            return value if value.dtype == torch.float32 else value.float()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return torch.tensor(float(value))
        raise MisconfigurationError(
            f"self.log({name!r}) got {type(value).__name__}; log a number, a scalar tensor or a torchmetrics Metric."
        )

    def _infer_batch_size(self, name: str, batch_size: int | None, reduce_fx: str) -> int:
        if batch_size is not None:
            return int(batch_size)
        if reduce_fx != "mean":
            return 1
        if self._batch_size is None:
            self._batch_size = extract_batch_size(self._batch) or 1
        return self._batch_size

    # --- reading -------------------------------------------------------------------------------
    def step_metrics(self, which: str) -> dict[str, Tensor]:
        """Latest step values; `which` is 'logger', 'prog_bar' or 'callback'."""
        out: dict[str, Tensor] = {}
        for entry in self.entries.values():
            if entry.step_value is None or not entry.on_step:
                continue
            if which == "callback" or getattr(entry, which):
                out[entry.step_key()] = entry.step_value
                if which == "callback" and entry.on_epoch and entry.alias_step:
                    out[entry.name] = entry.step_value
        return out

    def clear_step_values(self) -> None:
        """Forget the step values (at a training epoch's end, as Lightning resets its results): the next epoch's show
        from its first step on, and until then the values recorded elsewhere (metrics/routing.py) stand."""
        for entry in self.entries.values():
            entry.step_value = None

    def pending_sync_keys(self) -> list[str]:
        """Names of the sync_dist step values logged in this training_step, not reduced yet."""
        return [entry.name for entry in self._pending_sync]

    def take_pending_sync(self) -> list[_Entry]:
        """The deferred sync_dist step entries, for a caller that reduces them itself; the list is emptied."""
        pending, self._pending_sync = self._pending_sync, []
        return pending

    def flush_sync(self) -> None:
        """Reduce the deferred sync_dist step values (after the ranks agreed on their names)."""
        for entry in self._pending_sync:
            if entry.step_value is not None:
                entry.step_value = self._reduce(entry.step_value, entry.reduce_fx)
        self._pending_sync.clear()

    def epoch_end(self, where: str = "epoch end") -> dict[str, dict[str, Tensor]]:
        """Compute epoch values (reduced across ranks with sync_dist) and reset the accumulators."""
        out: dict[str, dict[str, Tensor]] = {"callback": {}, "logger": {}, "prog_bar": {}}
        if self._check_keys is not None:
            synced = [e.name for e in self.entries.values() if e.on_epoch and e.pending and e.sync_dist]
            self._check_keys(synced, where)
        for entry in self.entries.values():
            if not entry.on_epoch or not entry.pending:
                continue
            entry.pending = entry.alias_step = False
            value = entry.compute_epoch(self._reduce)
            if value is None:
                continue
            key = entry.epoch_key()
            self.output_loaders[key] = self.output_loaders[entry.name] = entry.dataloader_idx
            out["callback"][key] = value
            out["callback"][entry.name] = value
            if entry.logger:
                out["logger"][key] = value
            if entry.prog_bar:
                out["prog_bar"][key] = value
            entry.total, entry.weight = None, 0.0
        return out

    _SAVED_FIELDS = ("name", "on_step", "on_epoch", "prog_bar", "logger", "sync_dist", "reduce_fx", "step_value",
                     "total", "weight", "pending", "alias_step", "suffix", "dataloader_idx")

    def state_dict(self, before_batch: bool = False) -> dict[str, dict[str, Any]]:
        """The epoch accumulators, so a mid-epoch resume ends the epoch with the same values; with
        `before_batch`, as they were before the current batch logged anything (it will be trained again).

        torchmetrics objects keep their own state (on the module); only their bookkeeping is saved.
        """
        fields: dict[str, dict[str, Any]] = {key: vars(entry) for key, entry in self.entries.items()}
        if before_batch:
            for key, old in self._before_batch.items():
                if old is None:
                    fields.pop(key, None)
                else:
                    fields[key] = old
        return {key: {f: values[f] for f in self._SAVED_FIELDS if f in values} for key, values in fields.items()}

    def load_state_dict(self, state: dict[str, dict[str, Any]]) -> None:
        self.entries = {key: _Entry(**fields) for key, fields in state.items()}

    def reset_metric_objects(self) -> None:
        """Reset the torchmetrics objects logged this epoch: called after the epoch-end hooks, as in Lightning,
        so that `metric.compute()` inside `on_*_epoch_end` still gives the epoch's value."""
        for entry in self.entries.values():
            if entry.metric is not None:
                entry.metric.reset()

    def reset(self) -> None:
        for entry in self.entries.values():
            if entry.metric is not None:
                entry.metric.reset()
        self.entries.clear()
        self._pending_sync.clear()
        self._loader_of.clear()


def to_python(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Tensors → floats, for loggers and the progress bar (this is where a device sync happens)."""
    return {k: float(v.item()) if isinstance(v, Tensor) else float(v) for k, v in metrics.items()}
