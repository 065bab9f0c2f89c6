"""The S3 rows of benchmarks/checkpoint.py: what atomicity costs on an object store.

The store is moto's standalone S3 server on 127.0.0.1 (started here, objects kept in its memory), so the figures
are the cost of our protocol against the same bytes written by the plain client, not of a network:
  - save, ours:  `atomic_save(obj, "s3://.../ours.ckpt")`: the checkpoint as a new data object, then the commit
                 record; every round overwrites the previous round's checkpoint, so it also reads the old record
                 and deletes the old data object (the steady state of `last.ckpt`)
  - save, plain: `with fs.open("s3://.../plain.ckpt", "wb") as f: torch.save(obj, f)`: the same bytes, same client
                 (s3fs), same part size, overwriting in place, with no atomicity beyond one object's
  - load, ours:  `safe_load(url)`: read the record, then the data, size-check, `torch.load(weights_only=True)`
  - load, plain: `torch.load(io.BytesIO(fs.cat_file(url)), weights_only=True)`
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_io.atomic_file import atomic_save
from strategies.checkpoint_io.safe_load import safe_load

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
SAVE_OURS, SAVE_PLAIN = "atomic_save to s3:// (ours)", "fsspec open + torch.save (plain client)"
LOAD_OURS, LOAD_PLAIN = "safe_load from s3:// (ours)", "fsspec cat_file + torch.load (plain client)"


def available() -> str | None:
    """None when the S3 rows can run, else why not."""
    for module in ("s3fs", "moto", "flask"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[dev]')"
    if shutil.which("moto_server", path=str(Path(sys.executable).parent)) is None:
        return "the moto_server command is missing"
    return None


@contextmanager
def s3_bucket() -> Iterator[str]:
    """A bucket on a fresh moto server; the environment points s3fs at it while the block runs."""
    from strategies.comm.distributed import find_free_port

    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    command = [shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server",
               "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, **CREDENTIALS}, start_new_session=True)
    saved = {k: os.environ.get(k) for k in [*CREDENTIALS, "AWS_ENDPOINT_URL"]}
    os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL": url})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.25)
        import fsspec

        fsspec.get_filesystem_class("s3").clear_instance_cache()
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fsspec.filesystem("s3").mkdir(bucket)
        yield f"s3://{bucket}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def measure(obj: Any, rounds: int, run_rounds: Callable[..., dict[str, list[float]]]
            ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(save times, load times) by variant name, interleaved by `run_rounds` like the local rows."""
    import fsspec

    with s3_bucket() as bucket:
        fs = fsspec.filesystem("s3")
        ours, plain = f"{bucket}/ours.ckpt", f"{bucket}/plain.ckpt"

        def plain_save() -> None:
            with fs.open(plain, "wb") as handle:
                torch.save(obj, handle)

        saves = run_rounds({SAVE_OURS: lambda: atomic_save(obj, ours), SAVE_PLAIN: plain_save}, rounds,
                           lambda: None)
        loaded = safe_load(ours)  # sanity: what was committed is what was saved
        assert torch.equal(loaded["state_dict"]["0.weight"], obj["state_dict"]["0.weight"])
        listed = fs.ls(bucket, refresh=True)
        assert len(listed) == 3, listed  # plain.ckpt, ours.ckpt and exactly one data object
        loads = run_rounds({
            LOAD_OURS: lambda: safe_load(ours),
            LOAD_PLAIN: lambda: torch.load(io.BytesIO(fs.cat_file(plain)), weights_only=True),
        }, rounds, lambda: None)
    return saves, loads
