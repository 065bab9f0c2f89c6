"""What a loaded checkpoint must hold before anything is restored from it.

Why: a file that passes the safe loader can still hold anything (a hand-made dict, a file edited by a script,
another tool's format). Reading it blindly ends in a KeyError or TypeError deep inside a restore, without the
path. Each entry is checked here first, and a bad one is a CheckpointLoadError naming the file, the entry,
what it holds and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_io.sharded.manifest import ShardedRef
from strategies.exceptions import CheckpointLoadError

_FIX = "Load checkpoints written by trainer.save_checkpoint() or ModelCheckpoint; a checkpoint edited by hand " \
       "must keep every entry's type."

# entry -> (the type it must have, what it is). Entries not listed (format_version, extras a user's
# on_save_checkpoint added) are not read by the restore code.
_ENTRIES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "state_dict": ((Mapping, ShardedRef), "a dict of parameter names to tensors (the model weights)"),
    "hparams": (Mapping, "a dict of argument names to values (the module's __init__ arguments)"),
    "hparams_name": (str, "a str (the __init__ argument the hparams were given as, Lightning's key)"),
    "datamodule_hparams_name": (str, "a str (the DataModule's __init__ argument its hparams were given as)"),
    "hparams_replaced": (Mapping, "a dict of hparams keys to what they held (values stored by name only)"),
    "datamodule_hyper_parameters": (Mapping, "a dict of the DataModule's hyperparameters"),
    "optimizer_states": (list, "a list of optimizer state dicts"),
    "lr_schedulers": (list, "a list of scheduler state dicts"),
    "precision": (Mapping, "a dict (the precision plugin's state)"),
    "progress": (Mapping, "a dict of names to ints (the loop counters)"),
    "callbacks": (Mapping, "a dict keyed by state_key (the callback states)"),
    "metrics": (Mapping, "a dict (the logged metrics)"),
    "rng": (list, "a list (the per-rank RNG states)"),
    "loops": (list, "a list (the per-rank loop positions)"),
    "datamodule": (Mapping, "a dict (the DataModule's state)"),
}


def _kind(value: Any) -> str:
    return f"a {type(value).__module__}.{type(value).__qualname__}" if type(value).__module__ != "builtins" \
        else f"a {type(value).__name__}"


def check_contents(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Every entry the loaders read has the type they expect; the weights are there and are tensors."""
    if "state_dict" not in checkpoint:
        raise CheckpointLoadError(
            f"checkpoint {path} has no 'state_dict' (the model weights); it holds only {sorted(map(str, checkpoint))}. "
            f"It is not a complete checkpoint of this trainer. {_FIX}"
        )
    for name, (expected, what) in _ENTRIES.items():
        if name in checkpoint and not isinstance(checkpoint[name], expected):
            raise CheckpointLoadError(
                f"checkpoint {path}: entry {name!r} holds {_kind(checkpoint[name])}, but it must be {what}. {_FIX}"
            )
    _check_weights(checkpoint["state_dict"], path)
    _check_hparams_and_progress(checkpoint, path)


def _check_weights(weights: Any, path: str | Path) -> None:
    if isinstance(weights, Mapping):
        for key, value in weights.items():
            if not isinstance(key, str) or not isinstance(value, torch.Tensor):
                raise CheckpointLoadError(
                    f"checkpoint {path}: 'state_dict' entry {key!r} holds {_kind(value)}; the model weights must map "
                    f"parameter names (str) to tensors. {_FIX}"
                )


def _check_hparams_and_progress(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    for key in checkpoint.get("hparams", {}):
        if not isinstance(key, str) or not key.isidentifier():
            raise CheckpointLoadError(
                f"checkpoint {path}: 'hparams' has the key {key!r}, which cannot be an __init__ argument name. "
                "Pass the arguments yourself: load_from_checkpoint(path, **overrides) takes them as keywords. "
                f"{_FIX}"
            )
    for key, value in checkpoint.get("progress", {}).items():
        if not isinstance(value, int):
            raise CheckpointLoadError(
                f"checkpoint {path}: 'progress' entry {key!r} holds {_kind(value)}; the loop counters are ints. {_FIX}"
            )
    _check_per_rank(checkpoint, path)


def _check_per_rank(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """'loops' holds one dict per rank that saved, 'rng' one dict (or None: no RNG state, as in a checkpoint
    imported from Lightning) per rank."""
    for name, allowed in (("loops", Mapping), ("rng", (Mapping, type(None)))):
        for index, item in enumerate(checkpoint.get(name, [])):
            if not isinstance(item, allowed):
                raise CheckpointLoadError(
                    f"checkpoint {path}: {name!r}[{index}] holds {_kind(item)}, but each entry must be a dict (one per "
                    f"rank that saved). {_FIX}"
                )


def check_resumable(checkpoint: Mapping[str, Any], path: str | Path, has_optimizers: bool) -> None:
    """fit(ckpt_path=...) needs the training state, not only the weights (a weights-only save drops it)."""
    needed = ("optimizer_states", "progress") if has_optimizers else ("progress",)
    missing = [name for name in needed if name not in checkpoint]
    loops, rng = checkpoint.get("loops", []), checkpoint.get("rng", [])
    if not missing and loops and len(loops) != len(rng):
        raise CheckpointLoadError(
            f"checkpoint {path}: 'loops' holds {len(loops)} entries but 'rng' {len(rng)}; both hold one per rank that "
            f"saved. {_FIX}"
        )
    if missing:
        raise CheckpointLoadError(
            f"checkpoint {path} has no {' or '.join(repr(m) for m in missing)}: it holds the weights only (saved with "
            "save_weights_only=True, or by hand), so training cannot resume from it. To start a new fit from these "
            "weights, load them with YourModule.load_from_checkpoint(path) and call fit(model) without ckpt_path; to "
            "resume, pass a full checkpoint."
        )
