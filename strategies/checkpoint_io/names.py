"""Checkpoint names claimed by one run: a new run never overwrites a file of the same name that another run wrote.

A name this run has not written yet is claimed with an exclusive create of `<name>.claim` (O_EXCL, holding the
claimer's owner tag, strategies/checkpoint_io/temp_owner.py) before the save and released after it; while holding the
claim, a name that already exists is taken by another run, so the next `-v1`, `-v2`, ... is tried (Lightning's rule).
Two runs started at once on one folder (processes on one machine, or machines sharing a filesystem) thus end on
different names. A claim left by a writer that died is stale and taken over. Object stores have no exclusive
create: there the name is versioned when it exists, checked just before the save (a race stays possible).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path

from strategies.checkpoint_io.atomic_file import save_advice
from strategies.checkpoint_io.filesystem import AnyPath, exists, join, name, parent
from strategies.checkpoint_io.temp_owner import owner_is_gone, owner_tag
from strategies.exceptions import CheckpointSaveError

CLAIM_SUFFIX = ".claim"


def versioned(path: AnyPath, version: int) -> AnyPath:
    """`dir/epoch=1.ckpt` with version 2 -> `dir/epoch=1-v2.ckpt`."""
    base, dot, suffix = name(path).rpartition(".")
    stem, ext = (base, dot + suffix) if dot else (suffix, "")
    return join(parent(path), f"{stem}-v{version}{ext}")


def claim_name(path: AnyPath, own: Collection[str] = (), versions: Callable[[int], AnyPath] | None = None,
               first_version: int = 1) -> AnyPath:
    """Rank 0: the first of `path`, `path-v1`, `path-v2`, ... that is in `own` (a file this save replaces: re-saved in
    place) or that does not exist and no other run is writing, claimed for this process until `release_claim`.
    `versions(n)` names version n when the caller has its own naming (ModelCheckpoint's join character and
    extension); versions count from `first_version`."""
    name_of = versions or (lambda n: versioned(path, n))
    version = first_version - 1
    while True:
        candidate = path if version == first_version - 1 else name_of(version)
        if str(candidate) in own or _try_claim(candidate):
            return candidate
        version += 1


def _try_claim(candidate: AnyPath) -> bool:
    if not isinstance(candidate, Path):
        return not exists(candidate)
    try:
        return _claim_local(candidate)
    except OSError as err:  # a read-only folder, a file where the folder should be, ...: before any save starts
        raise CheckpointSaveError(
            f"cannot save checkpoints in {candidate.parent} ({err.strerror or err}): {save_advice(err)}."
        ) from err


def _claim_local(candidate: Path) -> bool:
    claim = candidate.with_name(candidate.name + CLAIM_SUFFIX)
    candidate.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _stale(claim):
                return False
            try:
                claim.unlink()
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(owner_tag())
        if candidate.exists():  # written (and released) by another run before our claim
            release_claim(candidate)
            return False
        return True


def _stale(claim: Path) -> bool:
    try:
        tag = claim.read_text()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return bool(tag) and owner_is_gone(tag)


def release_claim(path: AnyPath) -> None:
    """Drop this process's claim on `path` (after its save, or when it gives the name up)."""
    if isinstance(path, Path):
        try:
            path.with_name(path.name + CLAIM_SUFFIX).unlink()
        except OSError:  # none there (or the folder is unusable: the save's own error says why)
            pass
