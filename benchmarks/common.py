"""What every benchmark records beside its figures, so two result files can be compared."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str | None:
    """The framework revision measured (results drift with the code, so record which code)."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def load_average() -> list[float] | None:
    """1/5/15-minute load: on a shared 2-core machine this says whether wall times can be trusted."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartile: how far apart rounds landed (the noise band of a ratio)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return round(q[0], 4), round(q[2], 4)


def machine_info(**extra: Any) -> dict[str, Any]:
    """CPU, Python, torch, threads, platform and code revision, plus what a benchmark adds."""
    return {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
            "git_commit": git_commit(), **extra}


class StepClock:
    """Per-step stamps of wall and thread CPU time; every variant calls `tick` once per batch, so all pay alike."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def tick(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.thread_time())


def steady_intervals(stamps: list[float], warmup_steps: int) -> list[float]:
    """Step intervals in seconds, without the first `warmup_steps` (allocator, caches, first batches)."""
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)][warmup_steps:]


def write_results(out: Path, payload: dict[str, Any]) -> None:
    """Write a benchmark's JSON results file and say where it went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
