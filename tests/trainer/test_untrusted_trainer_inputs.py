"""Trainer inputs that took the machine or gave raw errors (issue 39, defects 5 and 7): a CPU rank count far beyond the
cores needs an explicit opt-in, and a checkpoint whose per-rank entries have the wrong type is named, not a
TypeError deep in the resume."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from strategies.exceptions import CheckpointLoadError, ConfigError
from strategies.launch.devices import ALLOW_MANY_CPU_RANKS, Hardware, usable_cpus
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.launch import REPO, clean_env
from trainer import Trainer
from trainer.setup.flags import parse_flags


def test_a_million_cpu_ranks_is_refused_at_once_naming_the_count_and_the_cores():
    """Defect 5: devices=1000000 on CPU kept starting rank processes (27 after 23 s, ~400 MB each) until killed."""
    children = len(psutil.Process().children(recursive=True))
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"devices=1000000 on CPU would start 1000000 rank processes on "
                                          rf"{usable_cpus()} usable CPU core\(s\).*{ALLOW_MANY_CPU_RANKS}=1"):
        Trainer(**{**QUIET, "accelerator": "cpu", "devices": 1_000_000})
    assert time.perf_counter() - started < 2
    assert len(psutil.Process().children(recursive=True)) == children, "a rank process was started"


def test_a_few_ranks_per_core_stay_fine_and_more_take_an_explicit_opt_in(monkeypatch):
    two_cores = Hardware(cuda_device_count=0, mps_available=False, cpu_count=2)
    assert len(parse_flags(accelerator="cpu", devices=8, hardware=two_cores).devices) == 8  # 4 per core
    with pytest.raises(ConfigError, match="devices=9 on CPU would start 9 rank processes on 2 usable CPU core"):
        parse_flags(accelerator="cpu", devices=9, hardware=two_cores)
    with pytest.raises(ConfigError, match="devices=9 on CPU"):
        parse_flags(accelerator="cpu", devices=[0] * 9, hardware=two_cores)
    monkeypatch.setenv(ALLOW_MANY_CPU_RANKS, "1")
    assert len(parse_flags(accelerator="cpu", devices=9, hardware=two_cores).devices) == 9


def test_the_cli_says_it_in_one_line_and_leaves_no_process(tmp_path: Path):
    config = tmp_path / "run.yaml"
    config.write_text("model: {class_path: tests.helpers.boring.BoringModel}\n"
                      "trainer: {accelerator: cpu, devices: 1000000, logger: false}\n")
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "trainer", "fit", "--config", str(config)], cwd=REPO,
                               env=clean_env(), stderr=subprocess.PIPE, text=True, start_new_session=True)
    _, err = process.communicate(timeout=120)
    elapsed = time.perf_counter() - started
    assert process.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "trainer.devices: devices=1000000 on CPU would start 1000000 rank processes" in lines[0]
    left = [p for p in psutil.process_iter(["pid"]) if _session(p) == process.pid]
    assert not left, f"processes left: {left}"
    assert elapsed < 60


def _session(process: psutil.Process) -> int | None:
    try:
        return os.getsid(process.pid)
    except OSError:
        return None


@pytest.mark.parametrize("entry, value, message", [
    ("loops", [1, 2], r"'loops'\[0\] holds a int, but each entry must be a dict"),
    ("loops", ["x"], r"'loops'\[0\] holds a str"),
    ("rng", ["x"], r"'rng'\[0\] holds a str"),
    ("loops", [{}, {}], r"'loops' holds 2 entries but 'rng' 1"),
])
def test_per_rank_entries_of_the_wrong_type_are_named(tmp_path: Path, entry: str, value: list, message: str):
    """Defect 7: a checkpoint whose `loops` entry had the wrong type was a raw TypeError deep in the resume."""
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(BoringModel())
    trainer.save_checkpoint(tmp_path / "good.ckpt")
    checkpoint = torch.load(tmp_path / "good.ckpt", weights_only=True)
    checkpoint[entry] = value
    torch.save(checkpoint, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointLoadError, match=rf"{tmp_path / 'bad.ckpt'}: {message}"):
        Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(
            BoringModel(), ckpt_path=tmp_path / "bad.ckpt")
