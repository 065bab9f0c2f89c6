"""Which checkpoint a run starts from: `ckpt_path` as given, "last", "best", "hpc" or "registry" resolved
to a file or folder, the newest intact one first."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from strategies.checkpoint_io.catalog import checkpoint_problem, find_checkpoints
from strategies.checkpoint_io.filesystem import AnyPath, join, parent, to_path
from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import ConfigError, MisconfigurationError
from trainer.loggers.base import run_folder
from trainer.state import TrainerFn

if TYPE_CHECKING:
    from trainer.trainer import Trainer


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
    candidates.extend(find_checkpoints(join(root, "checkpoints"), "last.ckpt"))  # see trainer.ranks.preemption
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


def check_weights_only(weights_only: bool | None) -> None:
    """Lightning 2.6's `weights_only` of fit/validate/test/predict: this Trainer always loads weights-only."""
    if weights_only is False:
        raise ConfigError(
            "weights_only=False: checkpoints always load weights-only here (torch's safe loader never runs code from "
            "the file). Register a trusted class with torch.serialization.add_safe_globals, and pass "
            "weights_only=True or leave it out."
        )
