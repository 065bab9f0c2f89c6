"""Safe (weights-only) checkpoint reads with friendly errors: every entry's CRC checked before anything is
unpickled, a local file memory-mapped, a Lightning file read with stand-ins; every failure a CheckpointLoadError."""

from __future__ import annotations

import importlib
import io
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_io import object_store
from strategies.checkpoint_io.filesystem import AnyPath, to_path
from strategies.checkpoint_io.integrity import (
    DamagedEntry,
    check_torchscript,
    is_zip,
    tensor_names_of_entry,
    verify_crcs,
    verify_file,
)
from strategies.checkpoint_io.weights_only import (
    LIGHTNING_DICTS,
    LIGHTNING_MARKER,
    load_with_stand_ins,
    pickle_mentions,
)
from strategies.exceptions import CheckpointLoadError


def load_cause(err: BaseException) -> str:
    """A short cause, without torch's advice to retry with weights_only=False (we never do)."""
    text = str(err)
    found = re.search(r"WeightsUnpickler error: (.*)", text, re.S)  # torch's verdict, after its advice
    sentences = re.split(r"(?<=\.)\s+|\n+", found.group(1) if found else text)
    kept = [part.strip() for part in sentences
            if part.strip() and not any(word in part.lower() for word in _ADVICE_WORDS)]
    text = " ".join(kept)[:200] or type(err).__name__
    return f"{type(err).__name__}: {text}"


_ADVICE_WORDS = ("weights_only", "documentation", "trust the source", "two options", "add_safe_globals",
                 "safe_globals")


def _clean_cause(err: BaseException) -> BaseException:
    """The same error without torch's advice to retry with weights_only=False (our docs forbid it), its traceback
    kept: chained under our CheckpointLoadError, it shows the real cause and nothing that advises an unsafe load."""
    text = load_cause(err).split(": ", 1)[-1]
    try:
        clean = type(err)(text)
    except Exception:  # noqa: BLE001 - an error type with another constructor
        clean = RuntimeError(text)
    return clean.with_traceback(err.__traceback__)


def _load_weights_only(source: Path | bytes, map_location: str | torch.device | None, mmap: bool) -> Any:
    """torch.load(weights_only=True). A file holding DTensors needs torch.distributed.tensor imported first, which
    `import trainer` skips (it costs about a second): import it then and load again, still weights-only."""
    def load() -> Any:
        if isinstance(source, bytes):
            return torch.load(io.BytesIO(source), map_location=map_location, weights_only=True)
        return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)

    try:
        return load()
    except pickle.UnpicklingError as err:
        if "torch.distributed.tensor" not in str(err):
            raise
    importlib.import_module("torch.distributed.tensor")  # registers DTensor with the weights-only unpickler

    return load()


def safe_load(path: str | Path, map_location: str | torch.device | None = "cpu") -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True`; every failure becomes a CheckpointLoadError.

    Every entry is checked against the CRC-32 its zip archive records before anything is unpickled
    (strategies/checkpoint_io/integrity.py). A local file is then memory-mapped (copy-on-write): its tensors are
    read when they are copied into the model, and the check has already read the file once, so the whole load
    costs about what `torch.load` alone does (benchmarks/checkpoint.py).
    """
    path = to_path(path)
    if isinstance(path, str):
        raw = object_store.read_bytes(path)  # follows the commit record; checks the size
        if not raw:
            raise CheckpointLoadError(f"checkpoint {path} is empty (0 bytes): it is truncated or was never written.")
        if is_zip(raw):
            check_torchscript(raw, path)
            check_integrity(lambda: verify_crcs(raw), raw, path)
        return _checked_load(raw, path, map_location)
    if not path.exists():
        raise CheckpointLoadError(f"checkpoint {path} does not exist. Check the path (or use ckpt_path='last').")
    if path.is_dir():
        hint = (" It is a sharded ZeRO checkpoint folder: load it with strategy='zero2' or 'zero3' (any number "
                "of processes).") if (path / "manifest.pt").is_file() else ""
        raise CheckpointLoadError(f"checkpoint {path} is a directory, but a checkpoint file was expected.{hint}")
    if path.stat().st_size == 0:
        raise CheckpointLoadError(f"checkpoint {path} is empty (0 bytes): it is truncated or was never written.")
    check_integrity(lambda: verify_file(path), path, path)
    return _checked_load(path, path, map_location)


def check_integrity(check: Callable[[], Any], source: Path | bytes, path: AnyPath) -> None:
    """Run an integrity `check`; a damaged entry becomes a CheckpointLoadError naming the file, entry and tensors."""
    try:
        check()
    except DamagedEntry as err:
        where = ""
        try:  # the error path only: load the damaged file to name the tensors in the damaged entry
            names = tensor_names_of_entry(_load_weights_only(source, "cpu", mmap=False), err.entry, err.found_crc)
            where = f" (it holds {', '.join(names)})" if names else ""
        except Exception:  # noqa: BLE001 - too damaged to load: the entry's name is all we can give
            pass
        raise CheckpointLoadError(
            f"checkpoint {path} is damaged: {err}{where}. Its bytes changed after it was written (disk, copy or "
            "transfer error); restore it from a copy or resume from another checkpoint."
        ) from None
    except CheckpointLoadError as err:
        if str(path) in str(err):
            raise
        raise CheckpointLoadError(f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {err}.") \
            from None


def _checked_load(source: Path | bytes, path: str | Path, map_location: str | torch.device | None) -> dict[str, Any]:
    mmap = isinstance(source, Path) and _is_zip_file(source)
    try:
        data = _load_weights_only(source, map_location, mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        data = _load_lightning_file(source, path, map_location, err) if found and pickle_mentions(
            source, LIGHTNING_MARKER) else None
        if data is not None:
            return data
        if found:
            raise CheckpointLoadError(
                f"checkpoint {path} was refused by the safe (weights-only) loader: it references {found.group(1)}, "
                "which is not allowed. Only tensors and plain Python values may be stored in a checkpoint; it is "
                "never loaded unsafely."
            ) from _clean_cause(err)
        raise CheckpointLoadError(
            f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {load_cause(err)}"
        ) from _clean_cause(err)
    except (RuntimeError, EOFError, IndexError, ValueError, OSError, zipfile.BadZipFile, KeyError) as err:
        raise CheckpointLoadError(
            f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {load_cause(err)}"
        ) from _clean_cause(err)
    if not isinstance(data, dict):
        raise CheckpointLoadError(f"checkpoint {path} holds a {type(data).__name__}, not a checkpoint dict.")
    return data


def _load_lightning_file(source: Path | bytes, path: str | Path, map_location: str | torch.device | None,
                         err: pickle.UnpicklingError) -> dict[str, Any] | None:
    """A Lightning checkpoint whose pickle names classes the safe loader refuses (hyperparameters holding a
    Namespace, a class, ...): still weights-only, with those rebuilt as StandIns for the reader to report.
    None when the file turns out not to be a Lightning checkpoint (it is then refused as usual)."""
    try:
        data = load_with_stand_ins(source, map_location, LIGHTNING_DICTS)
    except (pickle.UnpicklingError, RuntimeError, ValueError, TypeError) as again:
        raise CheckpointLoadError(
            f"checkpoint {path} (written by PyTorch Lightning) was refused by the safe (weights-only) loader even "
            f"with its unknown classes stood in for: {load_cause(again)}. It is never loaded unsafely."
        ) from _clean_cause(err)
    if not isinstance(data, dict) or "format_version" in data or LIGHTNING_MARKER.decode() not in data:
        return None  # not a Lightning checkpoint after all: refused as any other file
    return data


def _is_zip_file(path: Path) -> bool:
    with open(path, "rb") as handle:
        return is_zip(handle.read(4))
