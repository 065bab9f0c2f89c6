"""What every benchmark shares: step clocks, machine information and the result file format.

A result file (one per benchmark, written by `write_result`) is JSON with the keys of `RESULT_KEYS`. Its
`figures` list holds what docs/benchmarks.md shows, one dict per figure (keys `FIGURE_KEYS`, built by
`figure`): the spread of the measured values (min / median / max over rounds or repetitions), the ratio to
(and, where it means something, the difference from) the baseline measured in the same run, and the target
with its verdict. Everything else a script writes beside them (per-round data, its own tables) is extra.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

RESULT_KEYS = ("benchmark", "mode", "date", "machine", "config", "figures", "elapsed_s")
FIGURE_KEYS = ("name", "label", "unit", "role", "better", "min", "median", "max", "n", "baseline", "ratio",
               "ratio_min", "ratio_max", "delta", "target", "target_on", "target_met", "note")
MACHINE_KEYS = ("cpu", "cores", "logical_cpus", "python", "torch", "platform", "git_commit", "load_average")
# Who a figure belongs to: the docs colour plots by it and tell baselines from the framework's figures.
Role = Literal["baseline", "ours", "lightning", "reference"]
REPO = Path(__file__).resolve().parents[1]


def child_env(*, cached_bytecode: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's child process: this checkout first on PYTHONPATH (so the framework measured
    is the one beside the scripts), plus `extra`. `cached_bytecode` drops PYTHONDONTWRITEBYTECODE (the development
    sandbox sets it), so that imports are timed as a user's Python does them, from cached bytecode: with it set,
    every module edited since its bytecode was last cached is compiled again in every child."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else ""), **extra}
    if cached_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


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


def usable_cores() -> int:
    """CPUs this process may run on (the affinity mask), which can be fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartile: how far apart rounds landed (the noise band of a ratio)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return round(q[0], 4), round(q[2], 4)


def machine_info(**extra: Any) -> dict[str, Any]:
    """CPU, cores, Python, torch, threads, platform, load and code revision, plus what a benchmark adds."""
    return {"cpu": cpu_name(), "cores": usable_cores(), "logical_cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "git_commit": git_commit(), "load_average": load_average(), **extra}


def lightning_version() -> str | None:
    """The installed Lightning's version, or None (it is the optional `.[bench]` extra). Read from the package
    metadata: importing Lightning takes seconds, which a benchmark that does not time it should not pay."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightning")
    except PackageNotFoundError:
        return None


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


def paired(values: Sequence[float], base: Sequence[float], how: Literal["ratio", "delta"] = "ratio") -> list[float]:
    """Per-round ratios (or differences) of a variant to the baseline measured in the same round."""
    if how == "ratio":
        return [v / b for v, b in zip(values, base, strict=True)]
    return [v - b for v, b in zip(values, base, strict=True)]


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def figure(name: str, label: str, values: Sequence[float], unit: str, *, role: Role = "ours",
           better: Literal["lower", "higher"] = "lower", baseline: str | None = None,
           ratios: Sequence[float] | None = None, deltas: Sequence[float] | None = None,
           target: float | None = None, target_on: Literal["ratio", "delta", "value"] = "ratio",
           note: str | None = None) -> dict[str, Any]:
    """One figure of a result file.

    Args:
        name: key, unique within the benchmark (the docs and tests look figures up by it).
        label: what the docs' table calls it.
        values: the measurements in `unit`, one per round or repetition (min / median / max are taken here).
        unit: e.g. "µs/step", "s", "MiB", "images/s".
        role: "baseline", "ours", "lightning" or "reference" (another point of comparison).
        better: whether lower or higher values are better (time vs throughput).
        baseline: `name` of the figure this one is compared with, measured in the same run.
        ratios: per-round ratios to the baseline, paired within a round; the median is the headline ratio.
        deltas: per-round differences from the baseline in `unit`, paired likewise.
        target: the limit the figure is reported against (never asserted), on `target_on`.
        target_on: "ratio", "delta" or "value": which number the target limits.
        note: a few words the docs print in the target column (e.g. the formula a memory figure should match).
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError(f"figure {name!r} has no values")
    ratio = statistics.median(ratios) if ratios else None
    delta = statistics.median(deltas) if deltas else None
    checked = {"ratio": ratio, "delta": delta, "value": statistics.median(vals)}[target_on]
    met = None
    if target is not None and checked is not None:
        met = checked <= target if better == "lower" or target_on == "delta" else checked >= target
    return {
        "name": name, "label": label, "unit": unit, "role": role, "better": better,
        "min": _round(min(vals)), "median": _round(statistics.median(vals)), "max": _round(max(vals)), "n": len(vals),
        "baseline": baseline, "ratio": _round(ratio, 5),
        "ratio_min": _round(min(ratios), 5) if ratios else None,
        "ratio_max": _round(max(ratios), 5) if ratios else None,
        "delta": _round(delta), "target": target, "target_on": target_on, "target_met": met, "note": note,
    }


def write_result(out: Path, benchmark: str, figures: list[dict[str, Any]], *, mode: str, config: dict[str, Any],
                 elapsed_s: float, machine: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """Write a benchmark's JSON result file (the keys of `RESULT_KEYS`, then `extra`) and say where it went."""
    names = [f["name"] for f in figures]
    if len(set(names)) != len(names):
        raise ValueError(f"{benchmark}: figure names repeat: {names}")
    payload = {
        "benchmark": benchmark, "mode": mode, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine if machine is not None else machine_info(), "config": config, "figures": figures,
        "elapsed_s": round(elapsed_s, 2), **extra,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return payload
