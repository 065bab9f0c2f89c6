"""What a run is assembled from: the default callbacks and loggers, the resolved dataloaders per
stage, and the checkpoint a run resumes from. Kept out of trainer.py so that file stays about the run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.exceptions import ConfigError, StateKeyCollisionError
from trainer.setup.flags import RunSpec
from trainer.setup.loaded_classes import instances_of

if TYPE_CHECKING:
    from strategies.base import Strategy


def build_loggers(logger: Any, spec: RunSpec) -> list[Any]:
    """logger=True (or None, as in Lightning) → TensorBoardLogger in default_root_dir/runs/version_N; False → none;
    or the Logger(s) given."""
    from trainer.loggers.base import DummyLogger, Logger

    if logger is False:
        return []
    if spec.fast_dev_run:  # Lightning's rule: one logger that writes nothing stands in for the loggers
        return [DummyLogger()]
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

    A callback module is imported only to build a default callback (see trainer/setup/loaded_classes.py)."""
    given = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
    if given:
        from callbacks.base import Callback

        for cb in given:
            if not isinstance(cb, Callback):
                raise ConfigError(f"callbacks contains {cb!r}, which is not a callbacks.Callback instance.")
    has_checkpoint = bool(instances_of(given, *_CHECKPOINT))
    if has_checkpoint and not spec.enable_checkpointing and not spec.fast_dev_run:
        raise ConfigError("Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in "
                          "callbacks: drop one of them.")
    if spec.enable_checkpointing and not has_checkpoint:
        from callbacks.checkpoint import ModelCheckpoint

        given.append(ModelCheckpoint())
    bar = _progress_bar(given, spec)
    if bar is not None and bar not in given:
        given.append(bar)
    if spec.enable_model_summary and not instances_of(given, *_SUMMARY):
        given.append(_default_summary(bar))
    check_state_keys(given)
    return order_callbacks(given)


_TUNERS = (("callbacks.finders", "BatchSizeFinder"), ("callbacks.finders", "LearningRateFinder"))
_SAVERS = (("callbacks.base", "Checkpoint"),)  # ModelCheckpoint, OnExceptionCheckpoint, a user's subclass


def order_callbacks(callbacks: list[Any]) -> list[Any]:
    """Lightning's order: the tuner's callbacks first (their search runs before the others start), the checkpoint
    callbacks last (they save what the others left in their state), the rest as given."""
    first = {id(cb) for kind in _TUNERS for cb in instances_of(callbacks, *kind)}
    last = {id(cb) for kind in _SAVERS for cb in instances_of(callbacks, *kind)}
    return ([cb for cb in callbacks if id(cb) in first] + [cb for cb in callbacks if id(cb) not in first | last]
            + [cb for cb in callbacks if id(cb) in last])


def check_state_keys(callbacks: list[Any]) -> None:
    """Two callbacks with a state (`state_dict` overridden) may not share a `state_key`: one state would overwrite
    the other in checkpoints. Callbacks without a state may repeat (two LearningRateMonitors, two plain Callbacks).

    Raises:
        StateKeyCollisionError: (a ConfigError and a RuntimeError) naming the type and the fix.
    """
    if not callbacks:
        return  # nothing to compare, and `import callbacks` is not needed (a bare Trainer loads no callback module)
    from callbacks.base import Callback
    from trainer.hooks import is_overridden

    seen: dict[str, Any] = {}
    for cb in callbacks:
        if not is_overridden(cb, "state_dict", Callback):
            continue
        if cb.state_key in seen:
            raise StateKeyCollisionError(
                f"Found more than one stateful callback of type `{type(cb).__name__}` with state_key "
                f"{cb.state_key!r} (the other: a {type(seen[cb.state_key]).__name__}): their checkpoint states would "
                "overwrite each other. Give them different arguments, or a `state_key` property that tells them "
                "apart (Callback._generate_state_key).")
        seen[cb.state_key] = cb


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


def agree_logger_versions(strategy: Strategy, loggers: list[Any]) -> None:
    """Rank 0 picks each logger's run (version_N, a run id); the others take it, so every rank names the same."""
    for logger in loggers:
        identity = strategy.broadcast(logger.identity() if strategy.is_global_zero else None)
        if not strategy.is_global_zero:
            logger.adopt_identity(identity)
