"""ModelCheckpoint: save checkpoints on a cadence, keep the top-k by a monitored metric, and `last`.

Saving is collective: every rank calls `trainer.save_checkpoint` and the strategy decides who writes; the save
decision is agreed across ranks so no rank waits alone in a barrier.

The module has no `from __future__ import annotations`: the constructor's annotations are real types, so
jsonargparse (LightningCLI) reads `save_last: bool | Literal["link"] | None` as a type, as it does Lightning's.
"""

import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from callbacks.checkpoint_files import CheckpointFiles
from callbacks.checkpoint_names import check_options, resolve_dirpath
from strategies.checkpoint_io.filesystem import is_remote, join, to_path
from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import ConfigError, MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class ModelCheckpoint(CheckpointFiles):
    """Save checkpoints to `dirpath` (default: `<save_dir>/<name>/<version>/checkpoints` of the first logger, or
    `default_root_dir/checkpoints` without a logger), with Lightning's arguments, attributes and files.

    Without `monitor`, keeps the latest checkpoint (`save_top_k=-1`: all of them). With `monitor`, keeps the
    `save_top_k` best by `mode`. `save_last=True` also writes `last.ckpt` whenever a checkpoint is saved. Every
    option is described in docs/checkpointing.md.

    Args:
        dirpath: the folder, local (`~` expanded, kept as an absolute string) or an fsspec URL (`s3://bucket/ckpts`).
        filename: a template filled with `epoch`, `step` and logged metrics, e.g. `"{epoch}-{val_loss:.3f}"`.
        monitor: a logged metric to rank checkpoints by; None keeps the latest.
        verbose: log every save (and every candidate that was not in the top k) on rank 0.
        save_last: also write `last.ckpt` whenever a checkpoint is saved; `"link"`: make `last.ckpt` a link to the
            checkpoint just saved (an atomic symlink on a local folder; a copy on a remote store, which has no links).
        save_top_k: with `monitor`, how many of the best to keep (-1 all, 0 none).
        save_on_exception: save a checkpoint (and `last.ckpt` with `save_last`) when fit ends with an exception;
            one process only (the other ranks cannot join a save after an exception).
        save_weights_only: write weights only (not resumable).
        mode: `"min"` or `"max"`: which direction of `monitor` is better.
        auto_insert_metric_name: write `name=value` for each field of `filename`.
        every_n_train_steps: save after a training batch when `global_step % n == 0` (0: off).
        train_time_interval: a `timedelta`: save when that much time passed since the last time-based save.
        every_n_epochs: save at the end of every n-th epoch (default 1 unless a step or time cadence is given).
        save_on_train_epoch_end: save in `on_train_epoch_end` instead of after validation (None: Lightning's rule).
        enable_version_counter: when a file of the name to save exists (another run's, or one this run keeps),
            save as `name-v1.ckpt`, `-v2`, ... (default, as Lightning); False overwrites it.

    Attributes:
        best_model_path, best_model_score: the best checkpoint and its score (a 0-d tensor; None without monitor).
        best_k_models: path -> score (0-d tensors) of the kept top-k; `kth_best_model_path`, `kth_value`: the worst
            of them once k are kept. `current_score`: the score of the latest top-k save. `last_model_path`.

    Raises:
        ConfigError: an invalid `mode`, `save_top_k` or cadence, more than one cadence, or a `dirpath` URL whose
            protocol is unknown or whose package is not installed.
    """

    is_monitoring_callback = True

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs = 1  # Lightning's default cadence: after every validation (or training epoch)
        check_options(save_last, mode, save_top_k, monitor, every_n_train_steps or 0, every_n_epochs or 0,
                       train_time_interval)
        self.dirpath: str | None = resolve_dirpath(dirpath)
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps: int = every_n_train_steps or 0
        self.train_time_interval = train_time_interval
        self.every_n_epochs: int = every_n_epochs or 0
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = enable_version_counter
        self.current_score: Tensor | None = None
        self.best_k_models: dict[str, Tensor] = {}
        self.kth_best_model_path = ""
        self.kth_value: Tensor = torch.tensor(torch.inf if mode == "min" else -torch.inf)
        self.best_model_score: Tensor | None = None
        self.best_model_path = ""
        self.last_model_path = ""
        self._last_global_step_saved = 0  # nothing to save before the first step
        self._last_checkpoint_saved = ""  # the file of the newest save: save_last="link" points at it
        self._last_time_checked: float | None = None
        self._defer_save_until_validation = False  # a step/time save waits for the monitored metric of validation
        self._validated = False  # a validation ended in this fit: a missing monitor is then an error, not a warning
        self._warned_missing = False

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode,
                                        every_n_train_steps=self.every_n_train_steps,
                                        every_n_epochs=self.every_n_epochs,
                                        train_time_interval=self.train_time_interval)

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "current_score": self.current_score,
                "dirpath": self.dirpath, "best_k_models": dict(self.best_k_models),
                "kth_best_model_path": self.kth_best_model_path, "kth_value": self.kth_value,
                "last_model_path": self.last_model_path}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_dir = state_dict.get("dirpath", self.dirpath)
        if saved_dir == self.dirpath:
            self.best_model_score = state_dict["best_model_score"]
            self.kth_best_model_path = state_dict.get("kth_best_model_path", self.kth_best_model_path)
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.best_k_models = dict(state_dict.get("best_k_models", self.best_k_models))
            self.last_model_path = state_dict.get("last_model_path", self.last_model_path)
        else:
            rank_zero_warn(f"ModelCheckpoint: The dirpath has changed from {saved_dir!r} to {self.dirpath!r}; only "
                           "best_model_path is restored (best_model_score, kth_best_model_path, kth_value, "
                           "last_model_path and best_k_models belong to the other folder).")
        self.best_model_path = state_dict["best_model_path"]

    # --- where ---------------------------------------------------------------------------------
    def setup(self, trainer: "Trainer", pl_module: "TrainModule", stage: str) -> None:
        self.dirpath = trainer.strategy.broadcast(self.dirpath or self._default_dirpath(trainer))
        if self.save_on_exception and trainer.world_size > 1:
            raise ConfigError("ModelCheckpoint(save_on_exception=True) needs a single process: after an exception the "
                              "other ranks cannot join the save. Use Trainer(checkpoint_on_interrupt=True) instead.")
        # Lightning's warning, for fit only: test/predict after fit would otherwise warn about the run's own files
        if stage == "fit" and trainer.is_global_zero and self.save_top_k != 0 and self._has_files():
            rank_zero_warn(f"Checkpoint directory {self.dirpath} exists and is not empty.")

    @staticmethod
    def _default_dirpath(trainer: "Trainer") -> str:
        """`<save_dir or default_root_dir>/<name>/<version>/checkpoints` of the first logger (Lightning's rule; a
        logger's `sub_dir` is not part of it), `default_root_dir/checkpoints` without a logger."""
        if not trainer.loggers:
            return str(join(to_path(trainer.default_root_dir), "checkpoints"))
        from trainer.loggers.base import run_folder

        return str(join(run_folder(trainer.loggers[0], trainer.default_root_dir), "checkpoints"))

    # --- when ----------------------------------------------------------------------------------
    def _should_skip_saving_checkpoint(self, trainer: "Trainer") -> bool:
        return (bool(trainer.fast_dev_run) or trainer.state.fn != "fit" or trainer.sanity_checking
                or self._last_global_step_saved == trainer.global_step)

    def _should_save_on_train_epoch_end(self, trainer: "Trainer") -> bool:
        """Lightning's rule: after validation when validation runs every epoch at its end, else at the epoch end
        (no validation data); after validation for a time-based or a several-epochs validation cadence."""
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if isinstance(trainer.val_check_interval, (timedelta, str, dict)) or trainer.check_val_every_n_epoch != 1:
            return False
        if sum(trainer.num_val_batches) == 0:
            return True
        return bool(trainer.val_check_interval == 1.0)

    def _validation_follows(self, trainer: "Trainer", batch_idx: int) -> bool:
        """This is the epoch's last batch and its validation runs next (a metric read now would be stale)."""
        if batch_idx + 1 < trainer.num_training_batches or sum(trainer.num_val_batches) == 0:
            return False
        every = trainer.check_val_every_n_epoch
        return every is None or (trainer.current_epoch + 1) % every == 0

    def on_train_start(self, trainer: "Trainer", pl_module: "TrainModule") -> None:
        self._last_time_checked = time.monotonic()
        self._validated = False

    def on_train_batch_end(self, trainer: "Trainer", pl_module: "TrainModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step_due = self.every_n_train_steps >= 1 and trainer.global_step % self.every_n_train_steps == 0
        time_due = False
        if self.train_time_interval is not None:
            now = time.monotonic()
            elapsed = self._last_time_checked is not None and \
                now - self._last_time_checked >= self.train_time_interval.total_seconds()
            time_due = bool(trainer.strategy.broadcast(elapsed))  # rank 0's clock decides for everyone
            if time_due:
                self._last_time_checked = now
        if not (step_due or time_due):
            return
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and (self.monitor not in candidates or (
                not self._should_save_on_train_epoch_end(trainer) and self._validation_follows(trainer, batch_idx))):
            self._defer_save_until_validation = True  # save once validation has logged a fresh value
            return
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def on_train_epoch_end(self, trainer: "Trainer", pl_module: "TrainModule") -> None:
        if not self._should_skip_saving_checkpoint(trainer) and self._should_save_on_train_epoch_end(trainer):
            self._save_at_epoch_end(trainer)

    def on_validation_end(self, trainer: "Trainer", pl_module: "TrainModule") -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._validated = True
        if self._should_skip_saving_checkpoint(trainer) or self._should_save_on_train_epoch_end(trainer):
            return
        if self._defer_save_until_validation:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
            self._defer_save_until_validation = False
            return
        self._save_at_epoch_end(trainer)

    def _save_at_epoch_end(self, trainer: "Trainer") -> None:
        candidates = self._monitor_candidates(trainer)
        if self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save_topk_checkpoint(trainer, candidates)
        # `last` follows the checkpoints: written when one was saved now (or re-linked to the newest one)
        if self._last_global_step_saved == trainer.global_step or (
                self.save_last == "link" and self._last_checkpoint_saved):
            self._save_last_checkpoint(trainer, candidates)

    def on_train_end(self, trainer: "Trainer", pl_module: "TrainModule") -> None:
        """`save_last=True` writes `last.ckpt` at the end of fit when no checkpoint was saved during it (not under
        `fast_dev_run`, which saves nothing: Lightning writes this one file even then)."""
        if self.save_last and not self._last_checkpoint_saved and not trainer.fast_dev_run:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_exception(self, trainer: "Trainer", pl_module: "TrainModule", exception: BaseException) -> None:
        """`save_on_exception`: what was trained up to the failure, under the usual name (and `last.ckpt`)."""
        if not self.save_on_exception or trainer.fast_dev_run or trainer.sanity_checking or \
                trainer.state.fn != "fit" or trainer.global_step == self._last_global_step_saved:
            return
        candidates = self._monitor_candidates(trainer)
        path = self.format_checkpoint_name(candidates)
        self._save_checkpoint(trainer, path)
        self._save_last_checkpoint(trainer, candidates)
        rank_zero_info(f"ModelCheckpoint: {type(exception).__name__} raised ({exception}); saved {path}")

    # --- what ----------------------------------------------------------------------------------
    def _monitor_candidates(self, trainer: "Trainer") -> dict[str, Tensor]:
        """The logged metrics as tensors (copies), with `epoch` and `step` as ints (a logged `epoch` is a float)."""
        candidates = {k: (v.detach().clone() if isinstance(v, Tensor) else torch.tensor(v))
                      for k, v in trainer.callback_metrics.items()}
        epoch, step = candidates.get("epoch"), candidates.get("step")
        candidates["epoch"] = epoch.int() if epoch is not None else torch.tensor(trainer.current_epoch)
        candidates["step"] = step.int() if step is not None else torch.tensor(trainer.global_step)
        return candidates

    def _save_topk_checkpoint(self, trainer: "Trainer", candidates: dict[str, Tensor]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            self._save_none_monitor_checkpoint(trainer, candidates)
            return
        if self.monitor not in candidates:
            logged = [k for k in candidates if k not in ("epoch", "step")]
            message = (f"ModelCheckpoint(monitor={self.monitor!r}) found no such metric: could not find the monitored "
                       f"key in the returned metrics: {logged}. Log it with self.log({self.monitor!r}, value) or fix "
                       "monitor.")
            if self._validated:
                raise MisconfigurationError(message)
            if not self._warned_missing:  # before any validation it may simply not be logged yet
                self._warned_missing = True
                rank_zero_warn(message)
            return
        current = candidates[self.monitor]
        if self.check_monitor_top_k(trainer, current):
            self._update_best_and_save(current, trainer, candidates)
        elif self.verbose:
            rank_zero_info(f"Epoch {int(candidates['epoch'])}, global step {int(candidates['step'])}: "
                           f"{self.monitor!r} was not in top {self.save_top_k}")

    def check_monitor_top_k(self, trainer: "Trainer", current: Tensor | None = None) -> bool:
        """Whether `current` enters the top k (collective when the top k is full: every rank must agree)."""
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        kth = self.best_k_models.get(self.kth_best_model_path)
        if kth is None:  # bookkeeping from an older checkpoint: find the worst kept score
            kth = self.best_k_models[self._worst_path()]
        better = torch.lt if self.mode == "min" else torch.gt
        return trainer.strategy.reduce_boolean_decision(bool(better(current, kth)), all=True)

    def _worst_path(self) -> str:
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=lambda path: float(self.best_k_models[path]))

    def _update_best_and_save(self, current: Tensor, trainer: "Trainer", candidates: dict[str, Tensor]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        evicted = None
        if len(self.best_k_models) == k and k > 0:
            evicted = self.kth_best_model_path if self.kth_best_model_path in self.best_k_models else \
                self._worst_path()
            self.best_k_models.pop(evicted)
        if torch.isnan(current):  # a NaN is kept as the worst possible score, so any real value replaces it
            current = torch.tensor(torch.inf if self.mode == "min" else -torch.inf, device=current.device)
        path = self._claim(trainer, candidates, evicted or "")
        self.current_score = current
        self.best_k_models[path] = current  # bookkeeping first, so the checkpoint records itself (as in Lightning)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = self._worst_path()
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        best = min if self.mode == "min" else max
        self.best_model_path = best(self.best_k_models, key=lambda p: float(self.best_k_models[p]))
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose:
            rank_zero_info(f"Epoch {int(candidates['epoch'])}, global step {int(candidates['step'])}: "
                           f"{self.monitor!r} reached {float(current):0.5f} (best {float(self.best_model_score):0.5f}),"
                           f" saving model to {path!r} as top {k}")
        self._save_checkpoint(trainer, path)
        if evicted and self._should_remove_checkpoint(trainer, evicted, path):
            self._remove_checkpoint(trainer, evicted)

    def _save_none_monitor_checkpoint(self, trainer: "Trainer", candidates: dict[str, Tensor]) -> None:
        path = self._claim(trainer, candidates, self.best_model_path)
        previous, self.best_model_path = self.best_model_path, path
        self._save_checkpoint(trainer, path)
        if self.save_top_k == 1 and previous and self._should_remove_checkpoint(trainer, previous, path):
            self._remove_checkpoint(trainer, previous)

    def _save_last_checkpoint(self, trainer: "Trainer", candidates: dict[str, Tensor]) -> None:
        if not self.save_last:
            return
        path = self._claim(trainer, candidates, self.last_model_path, self.CHECKPOINT_NAME_LAST)
        previous, self.last_model_path = self.last_model_path, path
        target = self._last_checkpoint_saved
        if self.save_last == "link" and target and self.save_top_k != 0 and not is_remote(path):
            self._link_checkpoint(trainer, target, path)
        else:
            self._save_checkpoint(trainer, path)
        if previous and self._should_remove_checkpoint(trainer, previous, path):
            self._remove_checkpoint(trainer, previous)

