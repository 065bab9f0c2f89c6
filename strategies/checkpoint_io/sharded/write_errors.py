"""Why a sharded (DCP) write failed, in words: the errno when one survives, else what the disk says.

Why: DCP writes each shard with torch's zip writer, which swallows the OSError of a failed write and raises
`RuntimeError: ... unexpected pos ...`, and DCP wraps that in a CheckpointException (a BaseException) holding every
rank's traceback. A full disk then read as a wall of tracebacks on every rank without the path or the cause.
"""

from __future__ import annotations

import errno
import resource
import shutil
from pathlib import Path

from strategies.checkpoint_io.atomic_file import save_advice
from strategies.checkpoint_io.filesystem import is_remote

_LOW_SPACE = 1 << 20  # free bytes below which a failed write is put down to a full disk


def _causes(err: BaseException) -> list[BaseException]:
    """The errors inside a DCP CheckpointException (one per failed rank), or the error itself."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        return [pair[0] if isinstance(pair, tuple) else pair for pair in failures.values()]
    return [err]


def _os_error(err: BaseException) -> OSError | None:
    seen: BaseException | None = err
    for _ in range(8):  # the exception chain, a few links deep
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _disk_cause(label: str) -> str | None:
    """What the local disk under `label` says: full, or over the process's file-size limit."""
    if is_remote(label):
        return None
    folder = Path(label).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if free is not None and free < _LOW_SPACE:
        return (f"ENOSPC: the disk holding {folder} is full ({free} bytes free): "
                f"{save_advice(OSError(errno.ENOSPC, ''))}")
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        return f"EFBIG: {save_advice(OSError(errno.EFBIG, ''))} ({soft} bytes)"
    return None


def write_cause(err: BaseException, label: str) -> str:
    """One line: the errno and advice when known, else the disk's state, else the first rank's error."""
    causes = _causes(err)
    for cause in causes:
        found = _os_error(cause)
        if found is not None:
            name = errno.errorcode.get(found.errno or 0, "")
            return f"{name}: {found.strerror or found}: {save_advice(found)}"
    disk = _disk_cause(label)
    if disk is not None:
        return disk
    first = causes[0]
    text = str(first).strip().splitlines()
    return f"{type(first).__name__}: {text[-1][:300] if text else ''}".rstrip(": ")
