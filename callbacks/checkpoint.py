"""ModelCheckpoint: save checkpoints on a cadence, keep the top-k by a monitored metric, and `last`.

Saving is collective: every rank calls `trainer.save_checkpoint` and the strategy decides who
writes; the save decision is agreed across ranks so no rank waits alone in a barrier.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from callbacks.base import Callback
from strategies.checkpoint_io.catalog import find_checkpoints, link_checkpoint
from strategies.checkpoint_io.filesystem import AnyPath, join, list_names, to_path
from strategies.checkpoint_io.names import claim_name, release_claim
from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import ConfigError, MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

_FIELD = r"\{([A-Za-z_][\w/.-]*)(:[^}]*)?\}"  # compiled (and cached by `re`) at the first name formatted


class ModelCheckpoint(Callback):
    """Save checkpoints to `dirpath` (default: the `checkpoints` folder of the first logger's run).

    Without `monitor`, keeps the latest checkpoint (top-1 by recency). With `monitor`, keeps the
    `save_top_k` best by `mode`; `save_top_k=-1` keeps all. `save_last=True` also writes `last.ckpt`.
    Every option is described in docs/checkpointing.md.

    Args:
        dirpath: the folder, local or an fsspec URL (`s3://bucket/ckpts`); default `<run folder>/checkpoints`, where
            the run folder is the first logger's (see `trainer.loggers.run_folder`), or `default_root_dir` without
            a logger.
        filename: a template filled with `epoch`, `step` and logged metrics, e.g. `"{epoch}-{val_loss:.3f}"`.
        monitor: a logged metric to rank checkpoints by; None keeps the latest.
        verbose: log every save on rank 0.
        save_last: also write `last.ckpt` at every save; `"link"`: make `last.ckpt` a link to the checkpoint just
            saved (an atomic symlink on a local folder; a copy on a remote store, which has no links).
        save_top_k: with `monitor`, how many of the best to keep (-1 all, 0 none).
        mode: `"min"` or `"max"`: which direction of `monitor` is better.
        every_n_epochs: save at the end of every n-th epoch (default 1 unless a step or time cadence is given).
        every_n_train_steps: save after a training batch when `global_step % n == 0`.
        train_time_interval: a `timedelta`: save when that much time passed since the last time-based save.
        save_on_train_epoch_end: save in `on_train_epoch_end` instead of after validation.
        save_weights_only: write weights only (not resumable).
        auto_insert_metric_name: write `name=value` for each field of `filename`.
        enable_version_counter: when a file of the name to save exists (another run's, or one this run keeps),
            save as `name-v1.ckpt`, `-v2`, ... (default, as Lightning); False overwrites it.
        save_on_exception: save a checkpoint (and `last.ckpt` with `save_last`) when fit ends with an exception;
            one process only (the other ranks cannot join a save after an exception).

    Raises:
        ConfigError: an invalid `mode` or `save_top_k`, more than one cadence, or a `dirpath` URL whose protocol
            is unknown or whose package is not installed.
    """

    is_monitoring_callback = True
    CHECKPOINT_EXT = ".ckpt"
    LAST_NAME = "last"

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        mode: str = "min",
        every_n_epochs: int | None = None,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        save_on_train_epoch_end: bool | None = None,
        save_weights_only: bool = False,
        auto_insert_metric_name: bool = True,
        enable_version_counter: bool = True,
        save_on_exception: bool = False,
    ) -> None:
        if save_last not in (None, True, False, "link"):
            raise ConfigError(f"ModelCheckpoint(save_last={save_last!r}) is not valid: use True, False, None or "
                              "'link'.")
        if mode not in ("min", "max"):
            raise ConfigError(f"ModelCheckpoint(mode={mode!r}) is not valid: use 'min' or 'max'.")
        if save_top_k < -1:
            raise ConfigError(f"ModelCheckpoint(save_top_k={save_top_k}) is not valid: use -1, 0 or a positive int.")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ConfigError("ModelCheckpoint(save_top_k > 1) needs monitor= to rank checkpoints.")
        if sum(x is not None for x in (every_n_train_steps, every_n_epochs, train_time_interval)) > 1:
            raise ConfigError(
                "ModelCheckpoint: pass only one of every_n_train_steps, every_n_epochs and train_time_interval."
            )
        self.dirpath: AnyPath | None = to_path(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.mode = mode
        self.every_n_train_steps = every_n_train_steps or 0
        self.train_time_interval = train_time_interval
        step_based = bool(every_n_train_steps) or train_time_interval is not None
        self.every_n_epochs = every_n_epochs if every_n_epochs is not None else (0 if step_based else 1)
        self._last_time_save = time.monotonic()
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.save_weights_only = save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self.enable_version_counter = enable_version_counter
        self.save_on_exception = save_on_exception
        self._newest_written = ""  # the file the last top-k / latest save wrote: save_last="link" points at it
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._latest_path = ""
        self._last_saved_step = -1

    @property
    def state_key(self) -> str:
        return (
            f"ModelCheckpoint{{monitor={self.monitor!r}, mode={self.mode!r}, "
            f"every_n_train_steps={self.every_n_train_steps}, every_n_epochs={self.every_n_epochs}}}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "best_k_models": dict(self.best_k_models),
                "last_model_path": self.last_model_path, "latest_path": self._latest_path,
                "dirpath": str(self.dirpath) if self.dirpath else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") and self.dirpath is not None and str(self.dirpath) != state_dict["dirpath"]:
            return  # a different folder: its bookkeeping does not apply here
        self.best_model_score = state_dict.get("best_model_score")
        self.best_model_path = state_dict.get("best_model_path", "")
        self.best_k_models = dict(state_dict.get("best_k_models", {}))
        self.last_model_path = state_dict.get("last_model_path", "")
        self._latest_path = state_dict.get("latest_path", "")

    # --- where ---------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self.dirpath is None:
            from trainer.loggers.base import run_folder

            base = run_folder(trainer.loggers[0], trainer.default_root_dir) if trainer.loggers else \
                to_path(trainer.default_root_dir)
            self.dirpath = to_path(trainer.strategy.broadcast(str(join(base, "checkpoints"))))
        if self.save_on_exception and trainer.world_size > 1:
            raise ConfigError("ModelCheckpoint(save_on_exception=True) needs a single process: after an exception the "
                              "other ranks cannot join the save. Use Trainer(checkpoint_on_interrupt=True) instead.")
        # Lightning's warning, for fit only: test/predict after fit would otherwise warn about the run's own files
        if stage == "fit" and trainer.is_global_zero and self.save_top_k != 0 and self._has_files():
            rank_zero_warn(f"Checkpoint directory {self.dirpath} exists and is not empty.")

    def _has_files(self) -> bool:
        assert self.dirpath is not None
        try:
            return bool(list_names(self.dirpath))
        except OSError:  # unreadable: the first save reports it, on every rank
            return False

    def existing_checkpoints(self, trainer: Trainer) -> list[tuple[int, AnyPath]]:
        """(modification time in ns, path) of the checkpoints this callback could resume from (ckpt_path='last');
        on a remote store, committed ones only."""
        if self.dirpath is None:
            self.setup(trainer, trainer.lightning_module, "fit")
        assert self.dirpath is not None
        return find_checkpoints(self.dirpath, f"*{self.CHECKPOINT_EXT}")

    def format_checkpoint_name(self, metrics: dict[str, Any], name: str | None = None) -> AnyPath:
        """Fill `filename` (default 'epoch={epoch}-step={step}') with metric values."""
        template = name or self.filename or "{epoch}-{step}"

        def fill(match: re.Match[str]) -> str:
            key, spec = match.group(1), match.group(2) or ""
            value = metrics.get(key, 0)
            text = format(value, spec[1:]) if spec else str(value)
            return f"{key}={text}" if self.auto_insert_metric_name and not name else text

        assert self.dirpath is not None
        return join(self.dirpath, re.sub(_FIELD, fill, template).replace("/", "_") + self.CHECKPOINT_EXT)

    # --- when ----------------------------------------------------------------------------------
    def _saves_on_train_epoch_end(self, trainer: Trainer) -> bool:
        """Lightning's rule: at the training epoch's end (after the module's `on_train_epoch_end`, so a metric it
        logs can be monitored) when the epoch validates once at its end or not at all; after validation when it
        validates several times per epoch, by the clock, or not every epoch."""
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if isinstance(trainer.val_check_interval, timedelta):  # save after the timed validations
            return False
        if trainer.check_val_every_n_epoch != 1:
            return False
        return not sum(trainer.num_val_batches) or trainer.val_check_interval == 1.0

    @staticmethod
    def _skips_saving(trainer: Trainer) -> bool:
        """Lightning's rule: nothing is saved outside fit, in the sanity check or with fast_dev_run."""
        return bool(trainer.fast_dev_run) or trainer.state.fn is None or trainer.state.fn.value != "fit" \
            or trainer.sanity_checking

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._skips_saving(trainer):
            return
        if self.every_n_train_steps and trainer.global_step and trainer.global_step % self.every_n_train_steps == 0:
            self._save(trainer)
        elif self.train_time_interval is not None:
            elapsed = time.monotonic() - self._last_time_save >= self.train_time_interval.total_seconds()
            if trainer.strategy.broadcast(elapsed):  # rank 0's clock decides for everyone
                self._last_time_save = time.monotonic()
                self._save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        step_based = self.every_n_train_steps or self.train_time_interval is not None
        if self._skips_saving(trainer) or step_based or not self._saves_on_train_epoch_end(trainer):
            return
        if self._epoch_due(trainer):
            self._save(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        step_based = self.every_n_train_steps or self.train_time_interval is not None
        if self._skips_saving(trainer) or step_based or self._saves_on_train_epoch_end(trainer):
            return
        if self._epoch_due(trainer):
            self._save(trainer)

    def _epoch_due(self, trainer: Trainer) -> bool:
        return self.every_n_epochs > 0 and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        """`save_on_exception`: what was trained up to the failure, under the usual name (and `last.ckpt`)."""
        if not self.save_on_exception or trainer.sanity_checking or trainer.state.fn is None \
                or trainer.state.fn.value != "fit" or trainer.global_step == self._last_saved_step:
            return
        self._save(trainer)
        saved = self._newest_written or self.last_model_path
        rank_zero_info(f"ModelCheckpoint: {type(exception).__name__} raised; saved {saved}")

    # --- what ----------------------------------------------------------------------------------
    def _metrics(self, trainer: Trainer) -> dict[str, Any]:
        metrics: dict[str, Any] = {k: float(v) for k, v in trainer.callback_metrics.items()}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        return metrics

    def _save(self, trainer: Trainer) -> None:
        if trainer.global_step == self._last_saved_step or self.save_top_k == 0 and not self.save_last:
            return
        self._last_saved_step = trainer.global_step
        metrics = self._metrics(trainer)
        if self.monitor is None:
            self._save_latest(trainer, metrics)
        else:
            self._save_top_k(trainer, metrics)
        if self.save_last:
            self._save_last(trainer, metrics)
        for logger in trainer.loggers:  # e.g. to upload the new files as artifacts (rank 0 only, by the base class)
            logger.after_save_checkpoint(self)

    def _save_last(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        path = self._claim(trainer, self.format_checkpoint_name(metrics, self.LAST_NAME), self.last_model_path)
        self.last_model_path = str(path)
        target = self._newest_written
        if self.save_last == "link" and target and isinstance(path, Path):
            trainer.strategy.wait_for_saves()  # never link to a checkpoint still being written
            if trainer.is_global_zero:
                link_checkpoint(Path(target), path)
                release_claim(path)
            trainer.strategy.barrier("ModelCheckpoint last link")
        else:
            self._write(trainer, path)

    def _save_latest(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if self.save_top_k == 0:
            return
        path = self._claim(trainer, self.format_checkpoint_name(metrics), self._latest_path)  # Lightning's rule
        previous, self._latest_path = self._latest_path, str(path)
        self.best_model_path = str(path)
        self._write(trainer, path)
        self._newest_written = str(path)
        if self.save_top_k == 1 and previous and previous != str(path):
            self._remove(trainer, previous)
        if self.verbose:
            rank_zero_info(f"Epoch {trainer.current_epoch}, step {trainer.global_step}: saved {path}")

    def _save_top_k(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        assert self.monitor is not None
        if self.monitor not in metrics:
            raise MisconfigurationError(
                f"ModelCheckpoint(monitor={self.monitor!r}) found no such metric. Logged metrics: "
                f"{sorted(k for k in metrics if k not in ('epoch', 'step'))}. Log it with self.log or fix monitor."
            )
        score = metrics[self.monitor]
        improves = self._improves(score)
        if not trainer.strategy.reduce_boolean_decision(improves, all=True):
            return
        # Bookkeeping first, so the checkpoint being written already records itself (as in Lightning).
        path = self._claim(trainer, self.format_checkpoint_name(metrics))
        self.best_k_models[str(path)] = score
        evicted = None
        if self.save_top_k != -1 and len(self.best_k_models) > self.save_top_k:
            evicted = self._worst()
            del self.best_k_models[evicted]
        best = min if self.mode == "min" else max
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_score = self.best_k_models[self.best_model_path]
        self._write(trainer, path)
        self._newest_written = str(path)
        if evicted is not None and evicted != str(path):
            self._remove(trainer, evicted)
        if self.verbose:
            rank_zero_info(f"Epoch {trainer.current_epoch}: {self.monitor}={score:.5g}, saved {path}")

    def _claim(self, trainer: Trainer, path: AnyPath, previous: str = "") -> AnyPath:
        """Collective. `path`, or when a file of that name exists (or another run is writing it), its next free
        `-vN` version, claimed by rank 0 (strategies/checkpoint_io/names.py), as Lightning's `enable_version_counter`
        does. `previous` (the file this save replaces, e.g. a resumed run's `last-v1.ckpt`) is re-saved in place
        when the versions reach it; with `enable_version_counter=False` every name is."""
        if str(path) == previous or not self.enable_version_counter:
            return path
        chosen = path
        if trainer.is_global_zero:
            try:
                chosen = claim_name(path, {previous} if previous else ())
            except Exception:  # noqa: BLE001 - e.g. a read-only folder: the save itself then fails on every rank
                chosen = path  # with a CheckpointSaveError; raising here would leave the others in the broadcast
        chosen = to_path(trainer.strategy.broadcast(str(chosen)))
        if str(chosen) != str(path):
            rank_zero_warn(f"ModelCheckpoint: {path} exists (written by another run, or earlier in this one); this "
                           f"run saves {chosen} instead of overwriting it (enable_version_counter=False overwrites).")
        return chosen

    def _write(self, trainer: Trainer, path: AnyPath) -> None:
        """Save to `path` (claimed), then release the claim."""
        try:
            trainer.save_checkpoint(path, self.save_weights_only)
        finally:
            if trainer.is_global_zero:
                release_claim(path)

    def _improves(self, score: float) -> bool:
        if score != score:  # NaN never improves
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        worst = self.best_k_models[self._worst()]
        return score < worst if self.mode == "min" else score > worst

    def _worst(self) -> str:
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=self.best_k_models.__getitem__)

    def _remove(self, trainer: Trainer, path: str) -> None:
        # a file or a sharded folder, local or on a store; after the save in flight commits, if one is
        trainer.strategy.remove_checkpoint(to_path(path))
