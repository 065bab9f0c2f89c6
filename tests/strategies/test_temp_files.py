"""Who may delete a temp file: only a writer provably gone (strategies/checkpoint_io/temp_owner.py); and name claims."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from strategies.checkpoint_io.atomic_file import remove_stale_temp_files
from strategies.checkpoint_io.names import claim_name, release_claim
from strategies.checkpoint_io.temp_owner import machine_id, owner_tag, process_start, writer_is_gone
from tests.helpers.owners import dead_owner_tag
from tests.helpers.tiers import allowed_processes


@pytest.fixture
def live_process():
    with allowed_processes():  # a live writer's pid, not a run: the test stays in `make check`
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def test_only_temp_files_of_gone_writers_are_removed(tmp_path: Path, live_process: int):
    start = process_start(live_process)
    assert start
    names = {
        "live": f"a.ckpt.tmp-{owner_tag(live_process)}",
        "dead": f"b.ckpt.tmp-{dead_owner_tag()}",
        "reused_pid": f"c.ckpt.tmp-{machine_id()}-{live_process}-{start + 1}-0badf00d",  # same pid, other start
        "other_machine": f"d.ckpt.tmp-{'0' * 8 if machine_id() != '0' * 8 else '1' * 8}-1-1-0badf00d",
        "no_owner": "e.ckpt.tmp-deadbeef",  # written by a release before owners were recorded
        "mine": f"f.ckpt.tmp-{owner_tag()}",  # this process, between its saves: a leftover
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    removed = sorted(p.name for p in remove_stale_temp_files(tmp_path))
    assert removed == sorted(names[k] for k in ("dead", "reused_pid", "mine"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[k] for k in ("live", "other_machine",
                                                                                     "no_owner"))
    assert not writer_is_gone(names["live"]) and writer_is_gone(names["dead"])


def test_a_claimed_name_is_skipped_until_released_and_a_stale_claim_is_taken_over(tmp_path: Path,
                                                                                  live_process: int):
    target = tmp_path / "last.ckpt"
    (tmp_path / "last.ckpt.claim").write_text(owner_tag(live_process))  # another live run is writing last.ckpt
    assert claim_name(target) == tmp_path / "last-v1.ckpt"
    release_claim(tmp_path / "last-v1.ckpt")
    (tmp_path / "last.ckpt.claim").write_text(dead_owner_tag())  # that run died mid-save
    assert claim_name(target) == target
    assert (tmp_path / "last.ckpt.claim").read_text().split("-")[1] == str(os.getpid())  # ours now
    release_claim(target)
    target.write_bytes(b"saved by another run")
    assert claim_name(target) == tmp_path / "last-v1.ckpt"
    assert claim_name(target, own={str(target)}) == target  # this run's own name: re-saved in place
