"""Checkpoints written by PyTorch Lightning 2.x, read into this trainer's layout.

Why: a user moving over keeps their trained models and can continue their runs. The file is still read
weights-only (strategies/checkpoint_io/atomic_file.py); classes its pickle names that the safe loader refuses (a
Namespace or a class among the hyperparameters) arrive as StandIns and are reported, never run. What maps:

| Lightning | here |
| --- | --- |
| `state_dict`, `optimizer_states`, `lr_schedulers` | the same entries (the same torch state dicts) |
| `hyper_parameters` | `hparams` (values the safe loader refused: `hparams_replaced`, to be passed again) |
| `epoch`, `global_step`, `loops["fit_loop"]` progress | `progress`: the epoch and batch to continue at |
| `MixedPrecision` (the GradScaler state) | `precision["scaler"]` |
| `datamodule_hyper_parameters` | the same entry |
| `callbacks`, a DataModule's own state, `loops` beyond the fit position | not taken: named in one warning |
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.weights_only import contains_stand_ins
from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import CheckpointLoadError
from trainer.core.hparams_storage import stored_forms

_METADATA = {"pytorch-lightning_version", "hparams_name", "datamodule_hparams_name", "epoch", "global_step",
             "loops", "hyper_parameters", "datamodule_hyper_parameters"}
_SAME = ("optimizer_states", "lr_schedulers")
_PRECISION_KEYS = ("MixedPrecision", "MixedPrecisionPlugin", "NativeMixedPrecisionPlugin", "FSDPPrecision")


def is_lightning_checkpoint(checkpoint: Mapping[str, Any]) -> bool:
    return "format_version" not in checkpoint and "pytorch-lightning_version" in checkpoint


def from_lightning(checkpoint: Mapping[str, Any], path: str | Path, format_version: int,
                   world_size: int = 1) -> dict[str, Any]:
    """This trainer's checkpoint dict for a Lightning one; warns once naming what was not taken.

    Raises:
        CheckpointLoadError: the weights, optimizer or scheduler states hold something the safe loader refused.
    """
    version = checkpoint.get("pytorch-lightning_version")
    converted: dict[str, Any] = {"format_version": format_version}
    _take_states(checkpoint, converted, f"checkpoint {path} (PyTorch Lightning {version})")
    not_taken: list[str] = []
    _take_hparams(checkpoint, converted, not_taken)
    converted["progress"], mid_epoch = _progress(checkpoint, not_taken)
    if mid_epoch:  # a position inside an epoch: the next epoch's replay starts there (with this run's order)
        converted["loops"], converted["rng"] = [{} for _ in range(world_size)], [None] * world_size
    for key, value in checkpoint.items():
        if key in _PRECISION_KEYS and isinstance(value, Mapping):
            converted["precision"] = {"scaler": dict(value)} if value else {}  # Lightning saves the scaler's dict
        elif key not in _METADATA and key not in converted:
            not_taken.append(_describe(key, value))
    if not_taken:
        rank_zero_warn(
            f"checkpoint {path} was written by PyTorch Lightning {version}; loaded its weights"
            f"{', optimizer and scheduler states, loop position' if 'optimizer_states' in checkpoint else ''}. "
            f"Not taken: {'; '.join(not_taken)}."
        )
    return converted


def _take_states(checkpoint: Mapping[str, Any], converted: dict[str, Any], source: str) -> None:
    """The weights and the optimizer, scheduler and precision states, which must hold no stand-in."""
    precision_keys = [key for key in _PRECISION_KEYS if key in checkpoint]
    for key in ("state_dict", *_SAME, *precision_keys):
        refused = contains_stand_ins(checkpoint.get(key))
        if refused:
            raise CheckpointLoadError(
                f"{source}: its {key!r} holds {', '.join(refused)}, which the safe (weights-only) loader "
                "refuses; it cannot be taken, and is never loaded unsafely."
            )
        if key in checkpoint and key not in precision_keys:
            converted[key] = checkpoint[key]


def _describe(key: str, value: Any) -> str:
    if key == "callbacks" and isinstance(value, Mapping):
        return f"'callbacks' (the states of {', '.join(map(str, value))}: callbacks start fresh)"
    return f"{key!r} (no entry of this trainer reads it)"


def _take_hparams(checkpoint: Mapping[str, Any], converted: dict[str, Any], not_taken: list[str]) -> None:
    for key in ("hparams_name", "datamodule_hparams_name"):
        if isinstance(checkpoint.get(key), str):
            converted[key] = checkpoint[key]
    for source, target in (("hyper_parameters", "hparams"), ("datamodule_hyper_parameters",
                                                              "datamodule_hyper_parameters")):
        saved = checkpoint.get(source)
        if not isinstance(saved, Mapping):
            if saved is not None:
                not_taken.append(f"{source!r} (a {type(saved).__name__}, not a dict)")
            continue
        usable = {k: v for k, v in saved.items() if isinstance(k, str) and k.isidentifier()}
        not_taken += [f"{source}[{k!r}] (not an argument name)" for k in saved if k not in usable]
        stored, replaced = stored_forms(usable)
        converted[target] = stored
        refused = {k: what for k, what in replaced.items() if "refused by the safe loader" in what}
        not_taken += [f"{source}[{k!r}]: {what}" for k, what in refused.items()]
        if target == "hparams" and replaced:
            converted["hparams_replaced"] = replaced


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _counter(progress: Mapping[str, Any], part: str, name: str) -> int | None:
    value = _mapping(progress.get(part)).get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _progress(checkpoint: Mapping[str, Any], not_taken: list[str]) -> tuple[dict[str, Any], bool]:
    """Lightning's fit-loop counters as ours: the epoch to continue, and the batches of it already done."""
    global_step = checkpoint.get("global_step", 0)
    global_step = global_step if isinstance(global_step, int) else 0
    fit_loop = _mapping(_mapping(checkpoint.get("loops")).get("fit_loop"))
    epochs, batches = _mapping(fit_loop.get("epoch_progress")), _mapping(fit_loop.get("epoch_loop.batch_progress"))
    started, completed = _counter(epochs, "current", "started"), _counter(epochs, "current", "completed")
    # a batch is done once processed: ModelCheckpoint saves in on_train_batch_end, before `completed` counts it
    done = _counter(batches, "current", "processed") or _counter(batches, "current", "completed") or 0
    if started is None or completed is None:
        epoch = checkpoint.get("epoch", 0)
        not_taken.append(f"the loop position (no 'loops' entry): continuing at the start of epoch {epoch}")
        started = completed = epoch if isinstance(epoch, int) else 0
    epoch, within = completed, 0
    if started > completed:  # an epoch was open when Lightning saved
        if batches.get("is_last_batch") is True:  # its batches were all done (and its non-plateau schedulers stepped)
            epoch = completed + 1
        else:
            within = done
    total = _counter(batches, "total", "processed")
    progress = {"current_epoch": epoch, "global_step": global_step,
                "epoch_batches": within, "total_batches": total if total is not None else global_step,
                "epoch_finished": False, "val_started": False, "epoch_opened": within > 0}
    return progress, within > 0
