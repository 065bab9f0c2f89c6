"""The checkpoint schema: what goes into a checkpoint, in what order it is restored, and the checks
that keep it loadable with `torch.load(weights_only=True)`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies.checkpoint_io.safe_load import safe_load
from strategies.checkpoint_io.weights_only import refusal
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError, ConfigError, MisconfigurationError
from trainer.checkpoint.lightning_import import from_lightning, is_lightning_checkpoint
from trainer.checkpoint.resume import checkpoint_position, plan_resume
from trainer.checkpoint.validation import check_contents, check_resumable
from trainer.core.hparams import hparams_entries
from trainer.core.hparams_storage import read_hparams_file, rebuild_arguments
from trainer.hooks import DATAMODULE, call_hook, module_hook, profiled_method

if TYPE_CHECKING:
    from strategies.base import Strategy
    from trainer.core.datamodule import DataModule
    from trainer.core.module import TrainModule
    from trainer.loops.fit_state import FitState

FORMAT_VERSION = 1
WEIGHTS_ONLY_DROPS = ("optimizer_states", "lr_schedulers", "callbacks", "rng")  # what save_weights_only leaves out


def check_weights_only_safe(value: Any, path: str = "checkpoint") -> None:
    """Raise CheckpointSaveError naming the key path of the first value torch.load(weights_only) refuses.

    The rule is torch's own allowlist (strategies/checkpoint_io/weights_only.py), so whatever torch's safe loader reads
    (a MultiStepLR's Counter, an OrderedDict, user classes registered with add_safe_globals) is written.
    """
    found = refusal(value, path)
    if found is not None:
        raise CheckpointSaveError(
            f"{found}, which a safe (weights-only) load refuses. Store tensors, plain Python values and what "
            "torch.serialization.get_safe_globals() lists (register a trusted class with "
            "torch.serialization.add_safe_globals), e.g. convert configs with dict() or OmegaConf.to_container."
        )


def dump_checkpoint(loop: FitState, weights_only: bool = False) -> dict[str, Any]:
    """Build the checkpoint dict (without the training state when `weights_only`). Collective: call on every rank."""
    s, trainer = loop.strategy, loop.trainer
    module = s.module
    saved = checkpoint_position(loop)  # where a resume continues (trainer/checkpoint/loop_position.py)
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
        **hparams_entries(module),
        "callbacks": callbacks,
        "metrics": saved.metrics if saved.metrics is not None else loop.metrics.state_dict(),
        "rng": [state.pop("rng") for state in per_rank],
        "loops": per_rank,
        "world_size": s.world_size,
    }
    datamodule = trainer.datamodule
    datamodule_state = profiled_method(trainer.profiler, datamodule, "state_dict", DATAMODULE)() \
        if datamodule is not None else {}
    if datamodule_state:
        checkpoint["datamodule"] = datamodule_state
    if getattr(datamodule, "hparams", None):  # Lightning's keys, as for the module's
        entries = hparams_entries(datamodule)
        checkpoint["datamodule_hyper_parameters"] = entries["hparams"]
        if "hparams_name" in entries:
            checkpoint["datamodule_hparams_name"] = entries["hparams_name"]
    if weights_only:  # Lightning's rule: callbacks add nothing to a weights-only file, the module's hook still runs
        trainer.lightning_module.on_save_checkpoint(checkpoint)
    else:
        call_hook(loop, "on_save_checkpoint", checkpoint)
    if weights_only:
        for key in WEIGHTS_ONLY_DROPS:
            checkpoint.pop(key, None)
    check_weights_only_safe(checkpoint)
    return checkpoint


def _check_format(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """A checkpoint of this trainer, of a version this release reads, whose entries have the expected types."""
    version = checkpoint.get("format_version")
    if version is None:
        raise CheckpointLoadError(f"{path} has no 'format_version': it was not written by this trainer.")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointLoadError(
            f"{path} has format_version {version!r}, newer than this release understands ({FORMAT_VERSION}); "
            "upgrade the trainer package."
        )
    check_contents(checkpoint, path)


def _adopt_foreign(checkpoint: dict[str, Any], path: str | Path, world_size: int) -> dict[str, Any]:
    """A PyTorch Lightning 2.x checkpoint in this trainer's layout (trainer/checkpoint/lightning_import.py)."""
    if is_lightning_checkpoint(checkpoint):
        return from_lightning(checkpoint, path, FORMAT_VERSION, world_size)
    return checkpoint


def load_checkpoint_file(strategy: Strategy, path: str | Path) -> dict[str, Any]:
    """Read a checkpoint through the strategy (a file or a sharded folder) and check its format version."""
    checkpoint = _adopt_foreign(strategy.load_checkpoint(path), path, strategy.world_size)
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


def restore_module(strategy: Strategy, checkpoint: Mapping[str, Any], path: str | Path, strict: bool = True) -> None:
    """Load weights (before optimizers are built, so sharded strategies shard the loaded values); `strict` is the
    module's `strict_loading`."""
    try:
        strategy.load_module_state_dict(checkpoint["state_dict"], strict=strict)
    except RuntimeError as err:
        diff = describe_mismatch(strategy.module.state_dict(), checkpoint["state_dict"])
        raise CheckpointLoadError(
            f"{path} does not match the model: {diff or err}. Resume needs the same architecture; to load only "
            "the matching weights use TrainModule.load_from_checkpoint(path, strict=False)."
        ) from err


def restore_module_from(strategy: Strategy, model: TrainModule, path: str | Path) -> dict[str, Any]:
    """Read the checkpoint at `path` and load the module's weights from it; the module's `on_load_checkpoint` comes
    first, as in Lightning (it may edit the state_dict). Returns the checkpoint."""
    checkpoint = load_checkpoint_file(strategy, path)
    hook = module_hook(model, "on_load_checkpoint")
    if hook is not None:
        hook(checkpoint)
    restore_module(strategy, checkpoint, path, strict=model.strict_loading)
    return checkpoint


def restore_training_state(loop: FitState, checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Callbacks, optimizers, schedulers, precision, loop progress, RNG, in that order."""
    s, trainer = loop.strategy, loop.trainer
    check_resumable(checkpoint, path, bool(loop.optimizers))
    # Callbacks first, as in Lightning: one may change the optimizers' param groups (callbacks/finetuning.py)
    # before their saved state is loaded into them.
    states = checkpoint.get("callbacks", {})
    for cb in trainer.callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
        cb.on_load_checkpoint(trainer, trainer.lightning_module, dict(checkpoint))
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
    if progress.epoch_finished:
        _finish_saved_epoch(loop)
    max_epochs = loop.spec.max_epochs
    if max_epochs is not None and max_epochs != -1 and progress.current_epoch > max_epochs:
        raise ConfigError(f"You restored a checkpoint with current_epoch={progress.current_epoch}, but you have set "
                          f"Trainer(max_epochs={max_epochs}): the run is already past it. Raise max_epochs to train "
                          f"on from {path}.")
    if trainer.datamodule is not None and "datamodule" in checkpoint:
        profiled_method(trainer.profiler, trainer.datamodule, "load_state_dict", DATAMODULE)(checkpoint["datamodule"])


def _finish_saved_epoch(loop: FitState) -> None:
    """A checkpoint saved in on_train_epoch_end: finish that epoch's bookkeeping (the schedulers that monitor a
    metric step after that hook; the others stepped before it; manual optimization steps its own)."""
    progress = loop.progress
    if loop.automatic:
        loop.scheduler_stepper.step("epoch", progress.current_epoch + 1, loop.metrics.callback_metrics, plateau=True)
    progress.current_epoch += 1
    progress.epoch_finished, progress.epoch_batches, progress.epoch_opened = False, 0, False


def _rebuild_arguments(cls: type, checkpoint: Mapping[str, Any], key: str, path: str | Path,
                       hparams_file: str | Path | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The saved hparams under `key`, updated from `hparams_file` and `overrides`; the keys stored by name only
    must come from those (or be the __init__ default's class or function)."""
    from_file = read_hparams_file(hparams_file) if hparams_file is not None else {}
    saved = {**checkpoint.get(key, {}), **from_file}  # Lightning: the file updates the saved hparams
    replaced = {name: what for name, what in checkpoint.get("hparams_replaced", {}).items()
                if name not in from_file} if key == "hparams" else {}
    config_name = checkpoint.get("hparams_name" if key == "hparams" else "datamodule_hparams_name")
    hparams, missing = rebuild_arguments(cls, saved, replaced, overrides, config_name)
    if missing:
        listed = "; ".join(f"{name!r} ({what})" for name, what in missing.items())
        raise CheckpointLoadError(
            f"cannot rebuild {cls.__name__} from {path}: save_hyperparameters() received values a weights-only "
            f"checkpoint cannot hold, so they were stored by name only: {listed}. Pass them again: "
            f"{cls.__name__}.load_from_checkpoint(path, {', '.join(f'{k}=...' for k in missing)})."
        )
    return hparams


def _instantiate(cls: type, hparams: dict[str, Any], path: str | Path) -> Any:
    try:
        return cls(**hparams)
    except TypeError as err:
        raise CheckpointLoadError(
            f"cannot rebuild {cls.__name__} from the hparams saved in {path} ({sorted(hparams)}): {err}. "
            "Call self.save_hyperparameters() in __init__, or pass the missing arguments as keyword overrides."
        ) from err


def load_module_from_checkpoint(
    cls: type[TrainModule], path: str | Path, map_location: Any, strict: bool | None, overrides: dict[str, Any],
    hparams_file: str | Path | None = None,
) -> TrainModule:
    """Lightning's order: build the module, `configure_model`, `on_load_checkpoint` (which may edit the
    checkpoint's state_dict), then load the weights."""
    checkpoint = _adopt_foreign(safe_load(path, map_location=map_location or "cpu"), path, 1)
    _check_format(checkpoint, path)
    module = _instantiate(cls, _rebuild_arguments(cls, checkpoint, "hparams", path, hparams_file, overrides), path)
    if strict is not None and module.__dict__.get("_strict_loading") not in (None, strict):
        raise MisconfigurationError(
            f"{cls.__name__}.load_from_checkpoint(..., strict={strict!r}) contradicts the module's "
            f"strict_loading={module.strict_loading!r} set in __init__: give the same value to both, or leave one out."
        )
    strict = module.strict_loading if strict is None else strict
    module.configure_model()
    module.on_load_checkpoint(checkpoint)
    try:
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
    except RuntimeError as err:
        diff = describe_mismatch(module.state_dict(), checkpoint["state_dict"])
        hint = " Pass strict=False to load the matching keys only." if strict else ""
        raise CheckpointLoadError(f"{path} does not match {cls.__name__}: {diff or err}.{hint}") from err
    return module


def load_datamodule_from_checkpoint(cls: type[DataModule], path: str | Path, map_location: Any,
                                    hparams_file: str | Path | None, overrides: dict[str, Any]) -> DataModule:
    """A DataModule rebuilt from `datamodule_hyper_parameters`, with the state its `state_dict()` saved."""
    checkpoint = _adopt_foreign(safe_load(path, map_location=map_location or "cpu"), path, 1)
    _check_format(checkpoint, path)
    hparams = _rebuild_arguments(cls, checkpoint, "datamodule_hyper_parameters", path, hparams_file, overrides)
    datamodule = _instantiate(cls, hparams, path)
    if "datamodule" in checkpoint:
        datamodule.load_state_dict(checkpoint["datamodule"])
    return datamodule
