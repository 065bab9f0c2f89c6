"""A full disk and a read-only filesystem, for real: a 2 MB tmpfs mounted by the test when it runs as root (else a
file-size limit stands in for the full disk). Every rank gets our CheckpointSaveError naming the path and the errno."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from strategies.checkpoint_io.atomic_file import atomic_save
from strategies.exceptions import CheckpointSaveError
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from tests.helpers.tiers import allowed_processes
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
    with allowed_processes():  # mount(8), not a run: the test stays in `make check`
        mounted = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            with allowed_processes():
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
