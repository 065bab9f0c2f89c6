"""What a run is assembled from: the default callbacks and loggers, the resolved dataloaders per
stage, and the checkpoint a run resumes from. Kept out of trainer.py so that file stays about the run."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies.checkpoint_io import checkpoint_problem, find_checkpoints
from strategies.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import ConfigError, MisconfigurationError
from strategies.filesystem import AnyPath, join, parent, to_path
from trainer import data, overfit
from trainer.combined_loader import MODES, CombinedLoader, TrainingBatches
from trainer.flags import RunSpec
from trainer.loaded_classes import instances_of
from trainer.loggers.base import run_folder
from trainer.sampling import prepare_loader, record_indices
from trainer.seed import seed_workers_of
from trainer.state import TrainerFn

if TYPE_CHECKING:
    from strategies.base import Strategy
    from trainer.trainer import Trainer


def build_loggers(logger: Any, spec: RunSpec) -> list[Any]:
    """logger=True (or None, as in Lightning) → TensorBoardLogger in default_root_dir/runs/version_N; False → none;
    or the Logger(s) given."""
    from trainer.loggers.base import Logger

    if spec.fast_dev_run or logger is False:
        return []
    if logger is True or logger is None:
        from trainer.loggers.tensorboard import TensorBoardLogger

        return [TensorBoardLogger(save_dir=spec.default_root_dir, name="runs")]
    loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for item in loggers:
        if not isinstance(item, Logger):
            raise ConfigError(f"logger={item!r} is not a trainer.loggers.Logger; pass True, False, a Logger or a list.")
    return loggers


_CHECKPOINT = ("callbacks.checkpoint", "ModelCheckpoint")
_SUMMARY = ("callbacks.model_summary", "ModelSummary")


def build_callbacks(callbacks: Any, spec: RunSpec) -> list[Any]:
    """User callbacks plus the defaults (checkpoint, progress bar, summary); checkpoint callbacks last.

    A callback module is imported only to build a default callback (see trainer/loaded_classes.py)."""
    given = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
    if given:
        from callbacks.base import Callback

        for cb in given:
            if not isinstance(cb, Callback):
                raise ConfigError(f"callbacks contains {cb!r}, which is not a callbacks.Callback instance.")
    has_checkpoint = bool(instances_of(given, *_CHECKPOINT))
    if has_checkpoint and not spec.enable_checkpointing and not spec.fast_dev_run:
        raise ConfigError("a ModelCheckpoint callback was given but enable_checkpointing=False; drop one of them.")
    if spec.enable_checkpointing and not has_checkpoint:
        from callbacks.checkpoint import ModelCheckpoint

        given.append(ModelCheckpoint())
    bar = _progress_bar(given, spec)
    if bar is not None and bar not in given:
        given.append(bar)
    if spec.enable_model_summary and not instances_of(given, *_SUMMARY):
        given.append(_default_summary(bar))
    checkpoints = {id(cb) for cb in instances_of(given, *_CHECKPOINT)}
    if spec.fast_dev_run:
        given = [cb for cb in given if id(cb) not in checkpoints]
    keys = [cb.state_key for cb in given]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ConfigError(
            f"several callbacks share the state_key(s) {duplicates}; their checkpoint states would collide."
        )
    return [cb for cb in given if id(cb) not in checkpoints] + [cb for cb in given if id(cb) in checkpoints]


def _progress_bar(given: list[Any], spec: RunSpec) -> Any:
    """The run's progress bar: the one given (one at most, and only with `enable_progress_bar=True`, as in
    Lightning), else a `ProgressBar` when enabled."""
    bars = instances_of(given, "callbacks.progress_base", "ProgressBarBase")
    if len(bars) > 1:
        raise ConfigError(f"callbacks has {len(bars)} progress bars ({', '.join(type(b).__name__ for b in bars)}); "
                          "a Trainer takes one.")
    if bars and not spec.enable_progress_bar:
        raise ConfigError(f"Trainer(enable_progress_bar=False) was given a {type(bars[0]).__name__} callback; "
                          "drop one of them.")
    if bars:
        return bars[0]
    if not spec.enable_progress_bar:
        return None
    from callbacks.progress import ProgressBar

    return ProgressBar()


def _default_summary(bar: Any) -> Any:
    """ModelSummary, or RichModelSummary beside a RichProgressBar (rich is there then)."""
    if instances_of([bar], "callbacks.rich_progress", "RichProgressBar"):
        from callbacks.rich_model_summary import RichModelSummary

        return RichModelSummary()
    from callbacks.model_summary import ModelSummary

    return ModelSummary()


@dataclass
class StageLoaders:
    """The dataloaders of the current run and how many batches each may yield."""

    train: Any = None
    num_train: int | float = 0
    val: list[Any] = field(default_factory=list)
    val_limits: list[int | float] = field(default_factory=list)
    test: list[Any] = field(default_factory=list)
    test_limits: list[int | float] = field(default_factory=list)
    predict: list[Any] = field(default_factory=list)
    predict_limits: list[int | float] = field(default_factory=list)
    given: dict[str, Any] = field(default_factory=dict)  # the loaders passed to the entry point (None: none)
    _last: tuple[Any, ...] = ()
    requested_at: dict[str, float] = field(default_factory=dict)  # the epoch each fit stage's loaders were requested
    stale: bool = False  # a resumed fit's loaders were requested before its epoch was restored

    def resolve(self, spec: RunSpec, strategy: Strategy, module: Any, datamodule: Any, fn: TrainerFn,
                given: dict[str, Any], only: str | None = None) -> None:
        """Resolve the loaders `fn` needs (arguments > datamodule > module hooks), samplers injected, limits applied;
        in fit, `only="train"` or `"val"` requests one of the two again."""
        self.given, self._last = dict(given), (spec, strategy, module, datamodule, fn, given)
        sampler_kwargs = strategy.distributed_sampler_kwargs if spec.use_distributed_sampler else None

        def prepare(stage: str, training: bool) -> tuple[list[Any], list[int | float]]:
            loaders = data.resolve_loaders(stage, given.get(stage), datamodule, module)
            if spec.overfit_batches and fn == TrainerFn.FITTING:  # Lightning's rule: in fit only
                loaders = overfit.in_order(loaders, stage)
            even = strategy.evaluation_shards_even
            loaders = [prepare_loader(dl, sampler_kwargs, training, even) for dl in loaders]
            if stage == "predict":  # so writers and the gather across ranks know each batch's samples
                loaders = [record_indices(dl) for dl in loaders]
            for loader in loaders:
                seed_workers_of(loader, strategy.global_rank)
            limit = getattr(spec, f"limit_{stage}_batches")
            return loaders, [data.limit_batches(stage, data.loader_length(dl), limit) for dl in loaders]

        if fn == TrainerFn.FITTING:
            if only != "val":
                self._resolve_train(spec, strategy, sampler_kwargs, data.requested("train", given.get("train"),
                                                                                    datamodule, module))
            if only != "train":
                self.val, self.val_limits = _fit_validation(module, prepare)
        elif fn == TrainerFn.VALIDATING:
            self.val, self.val_limits = prepare("val", False)
            _require(self.val, "validate", "val_dataloader")
        elif fn == TrainerFn.TESTING:
            self.test, self.test_limits = prepare("test", False)
            _require(self.test, "test", "test_dataloader")
        else:
            self.predict, self.predict_limits = prepare("predict", False)
            _require(self.predict, "predict", "predict_dataloader")


    def _resolve_train(self, spec: RunSpec, strategy: Strategy, sampler_kwargs: dict[str, Any] | None,
                       source: Any) -> None:
        """One training loader as it is; several (a list, tuple or dict, or a CombinedLoader) read together as
        Lightning does, in "max_size_cycle" mode unless the CombinedLoader names another."""
        if source is None:
            raise MisconfigurationError(
                "fit() found no training data: pass train_dataloaders, a datamodule with train_dataloader(), "
                "or define train_dataloader() on the module."
            )
        combined = source if isinstance(source, CombinedLoader) else \
            CombinedLoader(source, "max_size_cycle") if isinstance(source, (list, tuple, dict)) else None
        if combined is not None and combined.mode == "sequential":
            raise MisconfigurationError('fit() does not support CombinedLoader(mode="sequential") for training; '
                                        f"use one of {[m for m in MODES if m != 'sequential']}.")
        loaders = combined.flattened if combined is not None else [source]
        if not loaders:
            raise MisconfigurationError("fit(): the collection of training loaders is empty.")
        if spec.overfit_batches:
            loaders = overfit.in_order(loaders, "train")
        prepared = []
        for loader in loaders:
            if not isinstance(loader, Iterable):
                raise MisconfigurationError(f"train_dataloader() returned {type(loader).__name__}; return a "
                                            "DataLoader, an iterable, or a list/dict of them.")
            loader = prepare_loader(loader, sampler_kwargs, True)
            seed_workers_of(loader, strategy.global_rank)
            prepared.append(loader)
        limits = [data.limit_batches("train", data.loader_length(dl), spec.limit_train_batches) for dl in prepared]
        if combined is None:
            self.train, self.num_train = prepared[0], limits[0]
            return
        combined.flattened, combined.limits = prepared, limits
        self.train = TrainingBatches(combined)
        self.num_train = data.loader_length(self.train)

    def sanity_checked(self) -> None:
        """Lightning does not count the sanity check's request of the validation loaders: with
        `reload_dataloaders_every_n_epochs`, the fit's first validation requests them again."""
        self.requested_at["val"] = -math.inf

    def resumed(self, requested_at: dict[str, float]) -> None:
        """A resumed fit goes on with the saved request epochs; with reloads on, its first epoch requests the
        loaders again, since the ones it has were requested before the checkpoint's epoch was restored."""
        self.requested_at.update(requested_at)
        self.stale = bool(requested_at) and bool(self._last and self._last[0].reload_dataloaders_every_n_epochs)

    def reload_due(self, stage: str, epoch: int) -> bool:
        """Lightning's `reload_dataloaders_every_n_epochs=N`: request the fit's `stage` ("train" or "val") loaders
        again once N epochs have passed since they were last requested (at the fit's start, the first time)."""
        every = self._last[0].reload_dataloaders_every_n_epochs if self._last else 0
        for each in ("train", "val"):  # both were requested at the fit's start, where the first check happens
            self.requested_at.setdefault(each, epoch)
        last = self.requested_at[stage]
        stale, self.stale = self.stale and stage == "train", self.stale and stage != "train"
        if not stale and (not every or epoch - last < every):
            return False
        spec, strategy, module, datamodule, fn, given = self._last
        self.resolve(spec, strategy, module, datamodule, fn, given, only=stage)
        self.requested_at[stage] = epoch
        return True

    def reload(self) -> None:
        """Resolve the current run's loaders again from the same sources (the hooks read the module's attributes
        anew: a batch size the BatchSizeFinder set takes effect, as after Lightning's search)."""
        if self._last:
            self.resolve(*self._last)


def _fit_validation(module: Any, prepare: Any) -> tuple[list[Any], list[int | float]]:
    """The loaders a fit validates on: none without a `validation_step`, or when every limit is 0."""
    from trainer.hooks import is_overridden
    from trainer.module import TrainModule

    loaders, limits = prepare("val", False) if is_overridden(module, "validation_step", TrainModule) else ([], [])
    return (loaders, limits) if any(limits) else ([], [])


def _require(loaders: list[Any], fn: str, hook: str) -> None:
    if not loaders:
        raise MisconfigurationError(
            f"{fn}() found no data: pass dataloaders=, a datamodule with {hook}(), or define {hook}() on the module."
        )


def default_ckpt_path(trainer: Trainer, fn: TrainerFn, ckpt_path: str | Path | None,
                      model_given: bool) -> str | Path | None:
    """Lightning's rule: validate/test/predict called without a model (the one the Trainer last ran) and without a
    `ckpt_path` evaluate the best checkpoint of that fit, with a warning, rather than whatever weights training
    ended on. Errors when there is none, naming both ways out."""
    if ckpt_path is not None or model_given or fn == TrainerFn.FITTING:
        return ckpt_path
    callback = trainer.checkpoint_callback
    if callback is None or not callback.best_model_path:
        raise MisconfigurationError(
            f"{fn.value}() without a model evaluates the best checkpoint of the previous fit (as in Lightning), but "
            "no ModelCheckpoint saved one. Pass the model to use its current weights "
            f"(trainer.{fn.value}(model)), or ckpt_path=... ."
        )
    rank_zero_warn(
        f"{fn.value}() was called without a model: it loads the best checkpoint of the previous fit, "
        f"{callback.best_model_path}. Pass ckpt_path='best', 'last' or a path to choose (and silence this), or the "
        "model to use its current weights."
    )
    return "best"


def resolve_ckpt_path(trainer: Trainer, ckpt_path: str | Path | None) -> AnyPath | None:
    """"last" → the newest checkpoint of this run's ModelCheckpoint folders, including the other runs of the first
    logger's experiment (`version_N` folders, earlier run ids: a requeued job gets a new one); on a remote store,
    committed checkpoints only. "best" → the checkpoint callback's best_model_path. "last" with nothing saved yet
    starts fresh, with a note. A path may be an fsspec URL."""
    if ckpt_path is None:
        return None
    if str(ckpt_path) == "best":
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not best:
            raise MisconfigurationError('ckpt_path="best" needs a ModelCheckpoint that has saved a checkpoint.')
        return to_path(best)
    if str(ckpt_path) != "last":
        return to_path(ckpt_path)
    candidates: list[tuple[int, AnyPath]] = []
    for cb in trainer.checkpoint_callbacks:
        candidates.extend(cb.existing_checkpoints(trainer))
    root = to_path(trainer.default_root_dir)
    candidates.extend(find_checkpoints(join(root, "checkpoints"), "last.ckpt"))  # see trainer.preemption
    for logger in trainer.loggers:  # the other runs of the same experiment
        candidates.extend(find_checkpoints(parent(run_folder(logger, root)), "*/checkpoints/*.ckpt"))
    if not candidates:
        rank_zero_info("ckpt_path='last' found no checkpoint; starting from scratch.")
        return None
    return _newest_intact(sorted(candidates, key=lambda found: found[0], reverse=True))


def _newest_intact(candidates: list[tuple[int, AnyPath]]) -> AnyPath:
    """The newest checkpoint that passes its integrity check; each damaged newer one is named in a warning. When
    none is intact, the newest is returned and its load reports the damage."""
    for _, path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        rank_zero_warn(f"ckpt_path='last': skipping the damaged checkpoint {path} ({problem}); trying an older one.")
    return candidates[0][1]


def agree_logger_versions(strategy: Strategy, loggers: list[Any]) -> None:
    """Rank 0 picks each logger's run (version_N, a run id); the others take it, so every rank names the same."""
    for logger in loggers:
        identity = strategy.broadcast(logger.identity() if strategy.is_global_zero else None)
        if not strategy.is_global_zero:
            logger.adopt_identity(identity)
