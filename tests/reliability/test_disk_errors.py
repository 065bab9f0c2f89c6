"""A full disk and a read-only filesystem, for real: a 2 MB tmpfs mounted by the test when it runs as root (else a
file-size limit stands in for the full disk). Every rank gets our CheckpointSaveError naming the path and the errno."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from callbacks import Callback, ModelCheckpoint
from strategies import ZeroStrategy
from strategies.checkpoint_io.atomic_file import atomic_save
from strategies.exceptions import CheckpointSaveError
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from trainer import Trainer

DDP = {**QUIET, "devices": 2, "strategy": "ddp"}


class Wide(BoringModel):
    """4 MB of weights: more than the 2 MB disk holds."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(1024, 1024)


@contextlib.contextmanager
def _tmpfs(folder: Path, options: str) -> Iterator[bool]:
    """Mount a tmpfs at `folder` with `options`; yields False when this process may not mount (not root)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)


@contextlib.contextmanager
def _full_disk(folder: Path) -> Iterator[str]:
    """A folder where writes fail: a 2 MB tmpfs (ENOSPC), else a 1 MB file-size limit with SIGXFSZ ignored (EFBIG).
    Yields the errno name the save error must carry."""
    with _tmpfs(folder, "size=2m") as mounted:
        if mounted:
            yield "ENOSPC"
            return
        old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, old_limit[1]))
        try:
            yield "EFBIG"
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
            signal.signal(signal.SIGXFSZ, old_handler)


def test_a_full_disk_is_a_checkpoint_save_error_naming_path_and_errno(tmp_path: Path):
    disk = tmp_path / "disk"
    with _full_disk(disk) as code:
        trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
        trainer.fit(Wide())
        with pytest.raises(CheckpointSaveError, match=rf"{disk / 'model.ckpt'} \({code}: .*untouched") as info:
            trainer.save_checkpoint(disk / "model.ckpt")
        assert "inline_container" not in str(info.value)
        assert os.listdir(disk) == [], "the failed save left its temp file behind"


def _save_on_full_disk(rank: int, path: str) -> str:
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **DDP)
    trainer.fit(Wide())
    try:
        trainer.save_checkpoint(path)
    except CheckpointSaveError as err:
        return str(err)
    return "saved"


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_full_disk_under_ddp_raises_on_every_rank(tmp_path: Path):
    disk = tmp_path / "disk"
    with _full_disk(disk) as code:
        messages = run_distributed(_save_on_full_disk, str(disk / "model.ckpt"))  # a killed rank fails here
    assert len(messages) == 2
    for message in messages:
        assert f"rank 0: could not save checkpoint to {disk / 'model.ckpt'} ({code}" in message, message


def test_a_read_only_filesystem_is_a_checkpoint_save_error(tmp_path: Path):
    disk = tmp_path / "ro"
    with _tmpfs(disk, "ro,size=1m") as mounted:
        if not mounted:
            pytest.skip("mounting a read-only tmpfs needs root")
        for target in (disk / "model.ckpt", disk / "sub" / "model.ckpt"):
            with pytest.raises(CheckpointSaveError, match=rf"{target.parent}.*[Rr]ead-only file system.*read-only"):
                atomic_save({"weights": torch.zeros(4)}, target)


class _SaveAtStep(Callback):
    """Saves into `path` at the end of the first training batch (inside fit: the async path's background write)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == 1:
            trainer.save_checkpoint(self.path)


def _sharded_save_on_full_disk(rank: int, path: str, mode: Any) -> str:
    trainer = Trainer(max_steps=2, limit_val_batches=0, callbacks=[_SaveAtStep(path)],
                      **{**DDP, "strategy": ZeroStrategy(stage=3, sharded_checkpoint=mode)})
    try:
        trainer.fit(Wide())
    except CheckpointSaveError as err:
        return str(err)
    return "saved"


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", [True, "async"])
def test_a_sharded_save_on_a_full_disk_names_the_folder_and_the_cause(tmp_path: Path, mode: Any):
    """Issue 39, defect 7: DCP's CheckpointException (a BaseException) escaped as a raw 'unexpected pos' traceback
    on every rank; the async save's error named neither the path nor the cause."""
    disk = tmp_path / "disk"
    with _full_disk(disk) as code:
        started = time.perf_counter()
        messages = run_distributed(_sharded_save_on_full_disk, str(disk / "sharded.ckpt"), mode, timeout=150)
        elapsed = time.perf_counter() - started
    for message in messages:
        assert message.startswith("rank"), message
        assert f"could not write the shards of {disk / 'sharded.ckpt'} ({code}: " in message, message
        assert "untouched" in message and "Traceback" not in message and "\n" not in message, message
    assert messages[0] == messages[1]
    assert elapsed < 150


def test_an_empty_path_and_a_file_as_the_checkpoint_folder_are_clear_save_errors(tmp_path: Path):
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(BoringModel())
    for bad in ("", "  "):
        with pytest.raises(CheckpointSaveError, match="cannot save a checkpoint to .*give a file path"):
            trainer.save_checkpoint(bad)
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("not a folder")
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0,
                      callbacks=[ModelCheckpoint(dirpath=in_the_way)], **{**QUIET, "enable_checkpointing": True})
    with pytest.raises(CheckpointSaveError, match=rf"cannot create checkpoint directory {in_the_way} \(File exists\)"):
        trainer.fit(BoringModel())


def test_a_read_only_checkpoint_folder_is_a_clear_save_error_not_a_claim_oserror(tmp_path: Path):
    disk = tmp_path / "ro"
    with _tmpfs(disk, "ro,size=1m") as mounted:
        if not mounted:
            pytest.skip("mounting a read-only tmpfs needs root")
        trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0,
                          callbacks=[ModelCheckpoint(dirpath=disk)], **{**QUIET, "enable_checkpointing": True})
        with pytest.raises(CheckpointSaveError, match=rf"{disk}.*[Rr]ead-only file system.*read-only"):
            trainer.fit(BoringModel())
