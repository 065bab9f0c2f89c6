"""Atomicity shown by killing the writer: a child process writing a checkpoint is SIGKILLed at many byte
offsets (and around the rename); the previous checkpoint must always load and equal its saved state."""

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

from strategies import checkpoint_io
from strategies.checkpoint_io import TMP_MARKER, atomic_save, remove_stale_temp_files, safe_load
from strategies.exceptions import CheckpointLoadError

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


def test_fifty_randomized_kills(tmp_path: Path):
    size = len(_serialized(_state(2)))
    seed = int(os.environ.get("KILL_TRIAL_SEED", "0")) or random.randrange(1, 2**31)
    print(f"KILL_TRIAL_SEED={seed} (set it to replay these trials)")  # shown by pytest when the test fails
    rng = random.Random(seed)
    default = "500" if os.environ.get("RELIABILITY_FULL") == "1" else "50"  # full mode: docs/reliability.md
    trials = int(os.environ.get("KILL_TRIALS", default))
    for trial in range(trials):
        folder = tmp_path / f"trial{trial}"
        folder.mkdir()
        offset = rng.choice([rng.randrange(size), "before_rename", "after_rename"])
        try:
            _kill_trial(folder, offset)
        except AssertionError as err:
            raise AssertionError(f"trial {trial} (kill at {offset!r}, KILL_TRIAL_SEED={seed}): {err}") from err
