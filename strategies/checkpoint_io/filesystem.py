"""Paths that may live on another filesystem.

A local path stays a `pathlib.Path` and takes the same local code paths as before; a URL with a protocol
(`s3://bucket/run`, `memory://run`, `gs://...`) stays a string and goes through fsspec. Why strings: `Path` folds
`s3://bucket/run` into `s3:/bucket/run`, so a remote path silently became a local folder named `s3:`.

fsspec is imported only when a URL is used. A protocol that fsspec does not know, or whose package is missing,
is a `ConfigError` naming what to install, raised where the path is first given (Trainer, ModelCheckpoint,
loggers, ckpt_path), not at the first save.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import IO, Any

from strategies.exceptions import ConfigError

PathLike = str | os.PathLike
AnyPath = Path | str  # a local Path, or a URL string

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://|::")
_LOCAL_PROTOCOLS = ("file", "local")
# protocol -> (package to install, this project's extra that installs it, or None)
# stores whose "folders" are key prefixes: nothing to create (fsspec's makedirs would create a missing bucket)
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "oci", "tos", "memory"})
_PACKAGES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", None), "gcs": ("gcsfs", None),
             "az": ("adlfs", None), "abfs": ("adlfs", None), "abfss": ("adlfs", None), "adl": ("adlfs", None)}


def is_remote(path: PathLike) -> bool:
    """True for a URL with a protocol other than file://; a `Path` is always local."""
    if isinstance(path, Path):
        return False
    text = os.fspath(path)
    if not _URL.search(text):
        return False
    return _protocol(text) not in _LOCAL_PROTOCOLS


def _protocol(url: str) -> str:
    last = url.rsplit("::", 1)[-1]
    return last.split("://", 1)[0] if "://" in last else "file"


def to_path(path: PathLike) -> AnyPath:
    """A `Path` for a local path (`file://` stripped), the URL string for a remote one (checked, no trailing /).

    Raises:
        ConfigError: fsspec does not know the protocol, or the package that implements it is missing.
    """
    if isinstance(path, Path):
        return path
    text = os.fspath(path)
    if not is_remote(text):
        return Path(text.split("://", 1)[1]) if text.startswith(("file://", "local://")) else Path(text)
    check_protocol(text)
    return text.rstrip("/") if not text.endswith("://") else text


def check_protocol(url: str) -> None:
    """Import the filesystem class for `url` now, so a typo or a missing package fails early and clearly."""
    try:
        import fsspec  # type: ignore[import-untyped]  # fsspec ships no type information
    except ImportError as err:  # a dependency of torch, but be explicit
        raise ConfigError(f"{url!r} is a URL, which needs fsspec: pip install fsspec.") from err
    for part in url.split("::"):
        protocol = _protocol(part)
        try:
            fsspec.get_filesystem_class(protocol)
        except ValueError as err:
            raise ConfigError(
                f"{url!r}: no filesystem is known for the protocol '{protocol}://'. Check the spelling, or install "
                "the fsspec implementation that provides it (e.g. s3fs for s3://, gcsfs for gs://)."
            ) from err
        except ImportError as err:
            package, extra = _PACKAGES.get(protocol, (None, None))
            hint = f'pip install "trainer[{extra}]" (or pip install {package})' if extra else (
                f"pip install {package}" if package else str(err))
            raise ConfigError(f"{url!r} needs the package behind '{protocol}://': {hint}.") from err


def get_fs(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of `url` and the path inside it (credentials and endpoint come from fsspec's and the
    store's own configuration, e.g. AWS_* environment variables for s3://)."""
    check_protocol(url)
    from fsspec.core import url_to_fs  # type: ignore[import-untyped]  # no type information

    return url_to_fs(url)


def join(base: AnyPath, *names: str) -> AnyPath:
    """`base / name / ...` for a Path, `base/name/...` for a URL."""
    if isinstance(base, Path):
        return base.joinpath(*names)
    return posixpath.join(base.rstrip("/"), *names) if not base.endswith("://") else base + posixpath.join(*names)


def parent(path: AnyPath) -> AnyPath:
    """The folder holding `path`."""
    if isinstance(path, Path):
        return path.parent
    head, _, _ = path.rstrip("/").rpartition("/")
    return head if not head.endswith(":/") else head + "/"


def name(path: AnyPath) -> str:
    """The last component of `path`."""
    return path.name if isinstance(path, Path) else path.rstrip("/").rpartition("/")[2]


def makedirs(path: AnyPath) -> None:
    """Create the folder and its parents if needed (object stores have no folders: nothing to do there)."""
    if isinstance(path, Path):
        path.mkdir(parents=True, exist_ok=True)
        return
    fs, inner = get_fs(path)
    makedirs_in(fs, inner)


def makedirs_in(fs: Any, inner: str) -> None:
    """`makedirs` for a path inside `fs`; never creates a bucket (a missing one is an error at the first write)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & OBJECT_STORES:
        fs.makedirs(inner, exist_ok=True)


def open_file(path: AnyPath, mode: str = "r") -> IO[Any]:
    """`open` for a Path, `fsspec` for a URL (a remote file appears when it is closed)."""
    if isinstance(path, Path):
        return open(path, mode, newline="" if "b" not in mode else None)
    fs, inner = get_fs(path)
    return fs.open(inner, mode)


def exists(path: AnyPath) -> bool:
    if isinstance(path, Path):
        return path.exists()
    fs, inner = get_fs(path)
    return bool(fs.exists(inner))


def list_names(folder: AnyPath, directories_only: bool = False) -> list[str]:
    """Names directly inside `folder` (empty when it does not exist); a remote listing is never a cached one."""
    if isinstance(folder, Path):
        if not folder.is_dir():
            return []
        return [p.name for p in folder.iterdir() if p.is_dir() or not directories_only]
    fs, inner = get_fs(folder)
    fs.invalidate_cache(inner)
    try:
        entries = fs.ls(inner, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [posixpath.basename(e["name"].rstrip("/")) for e in entries
            if e.get("type") == "directory" or not directories_only]
