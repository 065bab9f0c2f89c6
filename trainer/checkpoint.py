"""The checkpoint schema: what goes into a checkpoint, in what order it is restored, and the checks
that keep it loadable with `torch.load(weights_only=True)`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint_io import safe_load
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError
from trainer.checkpoint_contents import check_contents, check_resumable
from trainer.resume import checkpoint_position, plan_resume

if TYPE_CHECKING:
    from strategies.base import Strategy
    from trainer.fit_state import FitState
    from trainer.module import TrainModule

FORMAT_VERSION = 1
_PRIMITIVES = (str, int, float, bool, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)


def check_weights_only_safe(value: Any, path: str = "checkpoint") -> None:
    """Raise CheckpointSaveError naming the key path of the first value torch.load(weights_only) refuses."""
    if isinstance(value, _PRIMITIVES):
        return
    if type(value) in (dict, OrderedDict):  # subclasses (DictConfig, defaultdict) would be refused at load
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise CheckpointSaveError(f"{path} has a key of type {type(key).__name__}; use str or int keys.")
            check_weights_only_safe(item, f"{path}[{key!r}]")
        return
    if type(value) in (list, tuple, set):
        for idx, item in enumerate(value):
            check_weights_only_safe(item, f"{path}[{idx}]")
        return
    raise CheckpointSaveError(
        f"{path} holds a {type(value).__module__}.{type(value).__qualname__}, which a safe (weights-only) load "
        "refuses. Store primitives, lists, dicts and tensors only "
        "(e.g. convert configs with dict() or OmegaConf.to_container)."
    )


def dump_checkpoint(loop: FitState) -> dict[str, Any]:
    """Build the checkpoint dict. Collective: call on every rank."""
    s, trainer = loop.strategy, loop.trainer
    module = s.module
    saved = checkpoint_position(loop)  # where a resume continues (trainer/position.py)
    per_rank = s.all_gather_object(saved.loop)
    progress = saved.progress
    callbacks = saved.callbacks
    if callbacks is None:
        callbacks = {cb.state_key: state for cb in trainer.callbacks if (state := cb.state_dict())}
    checkpoint: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "state_dict": s.module_state_dict(),
        "optimizer_states": [s.optimizer_state_dict(opt) for opt in loop.optimizers],
        "lr_schedulers": [c.scheduler.state_dict() for c in loop.lr_scheduler_configs],
        "precision": s.precision.state_dict(),
        "progress": progress,
        "epoch": progress["current_epoch"],
        "global_step": progress["global_step"],
        "hparams": dict(getattr(module, "hparams", {})),
        "callbacks": callbacks,
        "metrics": saved.metrics if saved.metrics is not None else loop.metrics.state_dict(),
        "rng": [state.pop("rng") for state in per_rank],
        "loops": per_rank,
        "world_size": s.world_size,
    }
    datamodule_state = trainer.datamodule.state_dict() if trainer.datamodule is not None else {}
    if datamodule_state:
        checkpoint["datamodule"] = datamodule_state
    from trainer.hooks import call_hook

    call_hook(loop, "on_save_checkpoint", checkpoint)
    check_weights_only_safe(checkpoint)
    return checkpoint


def _check_format(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """A checkpoint of this trainer, of a version this release reads, whose entries have the expected types."""
    version = checkpoint.get("format_version")
    if version is None:
        hint = " It looks like a PyTorch Lightning checkpoint." if "pytorch-lightning_version" in checkpoint else ""
        raise CheckpointLoadError(f"{path} has no 'format_version': it was not written by this trainer.{hint}")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointLoadError(
            f"{path} has format_version {version!r}, newer than this release understands ({FORMAT_VERSION}); "
            "upgrade the trainer package."
        )
    check_contents(checkpoint, path)


def load_checkpoint_file(strategy: Strategy, path: str | Path) -> dict[str, Any]:
    """Read a checkpoint through the strategy (a file or a sharded folder) and check its format version."""
    checkpoint = strategy.load_checkpoint(path)
    _check_format(checkpoint, path)
    return checkpoint


def describe_mismatch(model_state: Mapping[str, Any], saved: Mapping[str, Any], limit: int = 5) -> str:
    """The first few missing, unexpected and mis-shaped keys between a model and a saved state dict."""
    missing = [k for k in model_state if k not in saved]
    unexpected = [k for k in saved if k not in model_state]
    shapes = [f"{k} (checkpoint {tuple(saved[k].shape)}, model {tuple(model_state[k].shape)})" for k in model_state
              if k in saved and hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(model_state[k].shape)]
    parts = [f"{label} ({len(keys)}): {', '.join(keys[:limit])}{', ...' if len(keys) > limit else ''}"
             for label, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                                 ("shape mismatches", shapes)) if keys]
    return "; ".join(parts)


def restore_module(strategy: Strategy, checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Load weights (before optimizers are built, so sharded strategies shard the loaded values)."""
    try:
        strategy.load_module_state_dict(checkpoint["state_dict"])
    except RuntimeError as err:
        diff = describe_mismatch(strategy.module.state_dict(), checkpoint["state_dict"])
        raise CheckpointLoadError(
            f"{path} does not match the model: {diff or err}. Resume needs the same architecture; to load only "
            "the matching weights use TrainModule.load_from_checkpoint(path, strict=False)."
        ) from err


def restore_training_state(loop: FitState, checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Optimizers, schedulers, precision, loop progress, callbacks, RNG, in that order."""
    s, trainer = loop.strategy, loop.trainer
    check_resumable(checkpoint, path, bool(loop.optimizers))
    saved_opts = checkpoint.get("optimizer_states", [])
    if len(saved_opts) != len(loop.optimizers):
        raise CheckpointLoadError(
            f"{path} holds {len(saved_opts)} optimizer state(s) but configure_optimizers() built "
            f"{len(loop.optimizers)}."
        )
    for opt, state in zip(loop.optimizers, saved_opts, strict=True):
        try:
            s.load_optimizer_state_dict(opt, state)
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointLoadError(f"{path}: optimizer state does not fit the optimizer: {err}") from err
    for config, state in zip(loop.lr_scheduler_configs, checkpoint.get("lr_schedulers", []), strict=False):
        config.scheduler.load_state_dict(state)
    s.precision.load_state_dict(checkpoint.get("precision", {}))
    loop.metrics.load_state_dict(checkpoint.get("metrics", {}))
    progress = loop.progress
    progress.load_state_dict(checkpoint.get("progress", {}))
    loop.position.reset()
    rng, loops = checkpoint.get("rng", []), checkpoint.get("loops", [])
    per_rank = [{**loop, "rng": state} for loop, state in zip(loops, rng, strict=True)] if loops else [
        {"rng": state} for state in rng]
    loop.resume_point = plan_resume(loop, per_rank, path) if per_rank else None
    if progress.epoch_finished:  # saved in on_train_epoch_end: finish that epoch's bookkeeping
        loop.scheduler_stepper.step("epoch", progress.current_epoch + 1, loop.metrics.callback_metrics)
        progress.current_epoch += 1
        progress.epoch_finished, progress.epoch_batches, progress.epoch_opened = False, 0, False
    states = checkpoint.get("callbacks", {})
    for cb in trainer.callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
        cb.on_load_checkpoint(trainer, trainer.lightning_module, dict(checkpoint))
    if trainer.datamodule is not None and "datamodule" in checkpoint:
        trainer.datamodule.load_state_dict(checkpoint["datamodule"])


def load_module_from_checkpoint(
    cls: type[TrainModule], path: str | Path, map_location: Any, strict: bool, overrides: dict[str, Any]
) -> TrainModule:
    checkpoint = safe_load(path, map_location=map_location or "cpu")
    _check_format(checkpoint, path)
    hparams = {**checkpoint.get("hparams", {}), **overrides}
    try:
        module = cls(**hparams)
    except TypeError as err:
        raise CheckpointLoadError(
            f"cannot rebuild {cls.__name__} from the hparams saved in {path} ({sorted(hparams)}): {err}. "
            "Call self.save_hyperparameters() in __init__, or pass the missing arguments as keyword overrides."
        ) from err
    try:
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
    except RuntimeError as err:
        diff = describe_mismatch(module.state_dict(), checkpoint["state_dict"])
        hint = " Pass strict=False to load the matching keys only." if strict else ""
        raise CheckpointLoadError(f"{path} does not match {cls.__name__}: {diff or err}.{hint}") from err
    module.on_load_checkpoint(checkpoint)
    return module
