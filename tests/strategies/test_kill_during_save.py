"""Atomicity shown by killing the writer: a child process writing a checkpoint is SIGKILLed at many byte
offsets (and around the rename); the previous checkpoint must always load and equal its saved state. The same
trials run against an S3 server (moto's, started by the tests), where the commit record replaces the rename."""

from __future__ import annotations

import io
import multiprocessing
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies.checkpoint_io import atomic_file as checkpoint_io
from strategies.checkpoint_io.atomic_file import TMP_MARKER, atomic_save, remove_stale_temp_files
from strategies.checkpoint_io.safe_load import safe_load
from strategies.exceptions import CheckpointLoadError
from tests.helpers.tiers import allowed_processes

pytestmark = pytest.mark.timeout(120)


def _state(version: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(version)
    return {"format_version": 1, "version": version, "weights": torch.randn(64, 64, generator=gen),
            "nested": {"step": version, "list": [torch.arange(10) * version]}}


def _serialized(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _child(path: str, kill_at: int | str) -> None:
    """Write version 2 over `path`, dying by SIGKILL at `kill_at` (a byte offset, or a point around the rename)."""
    torch.set_num_threads(1)
    data = _serialized(_state(2))

    def writer(obj: Any, handle: Any) -> None:
        if isinstance(kill_at, int):
            handle.write(data[:kill_at])
            handle.flush()
            os.fsync(handle.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        handle.write(data)

    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if kill_at == "before_rename":
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
        if kill_at == "after_rename":
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint_io.os.replace = replace  # only in this forked child
    atomic_save(_state(2), path, write=writer)
    os._exit(0)


def _kill_trial(folder: Path, kill_at: int | str) -> str:
    path = folder / "model.ckpt"
    atomic_save(_state(1), path)
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(str(path), kill_at))
    with allowed_processes():  # one short writer, killed: the offset classes stay in `make check`
        proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL, f"child was not killed at {kill_at!r} (exit {proc.exitcode})"
    loaded = safe_load(path)  # never a partial file: either the old checkpoint or the complete new one
    expected = _state(loaded["version"])
    assert loaded["version"] in (1, 2)
    assert torch.equal(loaded["weights"], expected["weights"])
    assert torch.equal(loaded["nested"]["list"][0], expected["nested"]["list"][0])
    for leftover in folder.iterdir():
        if TMP_MARKER in leftover.name:  # never picked up as a checkpoint; loadable only if it is complete
            try:
                partial = safe_load(leftover)
            except CheckpointLoadError:
                continue
            assert torch.equal(partial["weights"], _state(2)["weights"])
    remove_stale_temp_files(folder)  # temps are cleaned at the next start
    assert [p.name for p in folder.iterdir()] == ["model.ckpt"]
    return "new" if loaded["version"] == 2 else "old"


def _classes() -> list[int | str]:
    size = len(_serialized(_state(2)))
    return [0, 1, 10, 64, 512, size // 4, size // 2, 3 * size // 4, size - 1, "before_rename", "after_rename"]


@pytest.mark.parametrize("kill_at", _classes(), ids=lambda v: str(v))
def test_sigkill_at_every_offset_class_keeps_a_valid_checkpoint(tmp_path: Path, kill_at: int | str):
    outcome = _kill_trial(tmp_path, kill_at)
    assert outcome == ("new" if kill_at == "after_rename" else "old")


# The random offsets land in the classes above (a prefix of the file, or around the rename): RELIABILITY_FULL=1 runs
# 500 of them (docs/reliability.md), the default run the classes only.
@pytest.mark.exhaustive
def test_randomized_kills(tmp_path: Path):
    size = len(_serialized(_state(2)))
    seed = int(os.environ.get("KILL_TRIAL_SEED", "0")) or random.randrange(1, 2**31)
    print(f"KILL_TRIAL_SEED={seed} (set it to replay these trials)")  # shown by pytest when the test fails
    rng = random.Random(seed)
    trials = int(os.environ.get("KILL_TRIALS", "500"))
    for trial in range(trials):
        folder = tmp_path / f"trial{trial}"
        folder.mkdir()
        offset = rng.choice([rng.randrange(size), "before_rename", "after_rename"])
        try:
            _kill_trial(folder, offset)
        except AssertionError as err:
            raise AssertionError(f"trial {trial} (kill at {offset!r}, KILL_TRIAL_SEED={seed}): {err}") from err


# --- the same trials against an S3 server (moto's standalone server): no rename there ------------------------------
# The child writes version 2 over `url` and is SIGKILLed while the data is buffered (small checkpoint), after a part
# of a multipart upload reached the server (large checkpoint, 5 MiB parts), or just before / after the commit record.
def _big_state(version: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(version)
    return {"format_version": 1, "version": version, "weights": torch.randn(1600, 1000, generator=gen),  # 6.4 MB
            "nested": {"step": version, "list": [torch.arange(10) * version]}}


def _remote_child(url: str, kill_at: int | str, big: bool) -> None:
    torch.set_num_threads(1)
    import fsspec

    from strategies.checkpoint_io import object_store

    fsspec.config.conf.setdefault("s3", {})["default_block_size"] = 5 * 2**20  # the smallest S3 part
    state = (_big_state if big else _state)(2)
    data = _serialized(state)

    def writer(obj: Any, handle: Any) -> None:
        if isinstance(kill_at, int):
            handle.write(data[:kill_at])
            handle.flush()  # s3fs uploads a part here once 5 MiB are buffered
            os.kill(os.getpid(), signal.SIGKILL)
        handle.write(data)

    real_commit = object_store.commit

    def commit(*args: Any, **kwargs: Any) -> Any:
        if kill_at == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        previous = real_commit(*args, **kwargs)
        if kill_at == "after_commit":  # the old data object is not deleted yet
            os.kill(os.getpid(), signal.SIGKILL)
        return previous

    object_store.commit = commit  # only in this forked child
    atomic_save(state, url, write=writer)
    os._exit(0)


def _remote_kill_trial(folder: str, kill_at: int | str, big: bool = False) -> str:
    import fsspec

    make = _big_state if big else _state
    url = f"{folder}/model.ckpt"
    atomic_save(make(1), url)
    proc = multiprocessing.get_context("fork").Process(target=_remote_child, args=(url, kill_at, big))
    with allowed_processes():  # one short writer, killed
        proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL, f"child was not killed at {kill_at!r} (exit {proc.exitcode})"
    loaded = safe_load(url)  # the committed checkpoint: the previous one, or the complete new one
    assert loaded["version"] in (1, 2)
    expected = make(loaded["version"])
    assert torch.equal(loaded["weights"], expected["weights"])
    assert torch.equal(loaded["nested"]["list"][0], expected["nested"]["list"][0])
    from strategies.checkpoint_io.catalog import find_checkpoints

    assert [p.rsplit("/", 1)[1] for _, p in find_checkpoints(folder)] == ["model.ckpt"]
    remove_stale_temp_files(folder)  # uncommitted data is cleaned at the next start
    fs, inner = fsspec.core.url_to_fs(folder)
    fs.invalidate_cache()
    left = sorted(p.rsplit("/", 1)[1] for p in fs.find(inner))
    assert left[0] == "model.ckpt" and len(left) == 2 and left[1].startswith("model.ckpt.data-"), left
    return "new" if loaded["version"] == 2 else "old"


def _remote_classes() -> list[int | str]:
    size = len(_serialized(_state(2)))
    return [0, 1, 512, size // 2, size - 1, "before_commit", "after_commit"]


@pytest.mark.parametrize("kill_at", _remote_classes(), ids=lambda v: str(v))
def test_sigkill_during_an_s3_save_keeps_the_committed_checkpoint(s3_bucket: str, kill_at: int | str):
    outcome = _remote_kill_trial(f"{s3_bucket}/trial", kill_at)
    assert outcome == ("new" if kill_at == "after_commit" else "old")


def test_sigkill_during_a_multipart_s3_upload_keeps_the_previous_checkpoint(s3_bucket: str):
    size = len(_serialized(_big_state(2)))
    assert size > 6 * 2**20  # more than one 5 MiB part
    for offset in (5 * 2**20 + 1, size - 1):  # after the first part reached the server; the last byte missing
        assert _remote_kill_trial(f"{s3_bucket}/big{offset}", offset, big=True) == "old"
    import fsspec

    uploads = fsspec.filesystem("s3").list_multipart_uploads(s3_bucket.removeprefix("s3://"))
    assert len(uploads) == 2  # both killed uploads had sent a part, and neither became an object


@pytest.mark.exhaustive  # 100 random offsets, in the classes of the two tests above (docs/reliability.md)
def test_randomized_kills_during_s3_saves(s3_bucket: str):
    size = len(_serialized(_state(2)))
    seed = int(os.environ.get("KILL_TRIAL_SEED", "0")) or random.randrange(1, 2**31)
    print(f"KILL_TRIAL_SEED={seed} (set it to replay these trials)")
    rng = random.Random(seed)
    trials = int(os.environ.get("S3_KILL_TRIALS", "100"))
    for trial in range(trials):
        offset = rng.choice([rng.randrange(size), "before_commit", "after_commit"])
        try:
            _remote_kill_trial(f"{s3_bucket}/trial{trial}", offset)
        except AssertionError as err:
            raise AssertionError(f"trial {trial} (kill at {offset!r}, KILL_TRIAL_SEED={seed}): {err}") from err
