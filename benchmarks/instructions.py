"""Instructions per training step, counted by valgrind's callgrind: the per-step overhead without the noise.

`overhead.py` times the same workload, and on a shared 2-core machine its rounds swing by more than the
framework's cost (a raw step measured 550-1,000 µs on different days). An instruction count does not move with
the machine's load: the same code on the same data executes the same instructions, so the ratio to the raw loop
repeats to a fraction of a percent and a change of a few function calls per step shows.

It is not a time. Python bytecode costs more cycles per instruction than torch's work in the raw step (the
interpreter's jumps between bytecodes mispredict; docs/benchmarks.md), so the framework's share of the wall time is
larger than its share of the instructions; `overhead.py` stays the measure of the
targets, and this benchmark is the one to compare two versions of the loop with.

The variants of `overhead.py` (the same model, data, loader and per-step stamp) run one after another in one
child process under `valgrind --tool=callgrind --instr-atstart=no`. Nothing is instrumented while Python starts
and imports (under valgrind that alone takes about 30 s, so one child pays it once). For each variant the child
switches instrumentation on at its first counted step and off after its last, through the client requests of
`callgrind_marks.c` (compiled here with `cc`), and callgrind writes the counts of exactly those steps to a dump
of their own.

    .venv/bin/python benchmarks/instructions.py            # raw, the hook contract alone, ours, Lightning (3 minutes)
    .venv/bin/python benchmarks/instructions.py --quick    # raw and ours only (about 1 minute)
    .venv/bin/python benchmarks/instructions.py --variants all   # adds self.log, the progress bar, Lightning's logging

Needs valgrind, its headers (`valgrind/callgrind.h`) and a C compiler; the suite shows it as not run without them.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "instructions.json"
ALL_VARIANTS = ("raw", "floor", "ours", "ours_log", "ours_log_bar", "lightning", "lightning_log", "lightning_log_bar")
# One child pays valgrind's start (30 s) and Lightning's import once, then 20-40 s a variant: four keep `make bench`
# within its 15 minutes.
FULL_VARIANTS = ("raw", "floor", "ours", "lightning")
QUICK_VARIANTS = ("raw", "ours")
_DUMP = re.compile(r"^desc: Trigger: Client Request: (\w+)$.*?^totals: (\d+)$", re.MULTILINE | re.DOTALL)


def missing_tools() -> list[str]:
    """What this machine lacks to run the benchmark (empty when it can)."""
    missing = [tool for tool in ("valgrind", "cc") if shutil.which(tool) is None]
    if not any(Path(d, "valgrind", "callgrind.h").is_file() for d in ("/usr/include", "/usr/local/include")):
        missing.append("valgrind/callgrind.h (the valgrind headers, e.g. the valgrind-dev package)")
    return missing


def build_marks(folder: Path) -> Path:
    """Compile callgrind_marks.c into a shared library in `folder`."""
    lib = folder / "libcallgrind_marks.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(HERE / "callgrind_marks.c")], check=True)
    return lib


# --- the child: every variant in turn, each instrumented only over its counted steps --------------------------
def run_child(variants: list[str], warmup: int, steps: int, lib_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    import overhead
    from common import StepClock

    marks = ctypes.CDLL(lib_path)
    if not marks.marks_on_valgrind():
        raise SystemExit("--child runs under valgrind (the parent starts it so)")

    class MarkingClock(StepClock):
        """Stamps like every variant's clock; instrumentation is on from stamp `warmup` to stamp `warmup + steps`."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name.encode()

        def tick(self) -> None:
            super().tick()
            if len(self.wall) == warmup:
                marks.marks_start()
            elif len(self.wall) == warmup + steps:
                marks.marks_stop(self.name)

    cfg = overhead.Config(samples=64 * (warmup + steps + 1), epochs=1, rounds=1)
    dataset = overhead.make_data(cfg)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch imports torch._dynamo at the first one
    runners = overhead.build_variants(with_lightning=any(v.startswith("lightning") for v in variants))
    for variant in variants:
        clock = MarkingClock(variant)
        runners[variant](dataset, cfg, clock=clock)
        if len(clock.wall) < warmup + steps:
            raise SystemExit(f"{variant}: {len(clock.wall)} steps ran, {warmup + steps} needed")


# --- the parent ----------------------------------------------------------------------------------------------
def count(variants: tuple[str, ...], warmup: int, steps: int, lib: Path, folder: Path) -> dict[str, float]:
    """Instructions per step of each variant, from one child under callgrind (one dump per variant)."""
    out, log = folder / "callgrind.out", folder / "valgrind.log"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", f"--log-file={log}",
           sys.executable, str(Path(__file__).resolve()), "--child", ",".join(variants), "--warmup", str(warmup),
           "--steps", str(steps), "--lib", str(lib)]
    # Under the suite's 900 s per benchmark: on a hang this process kills valgrind before run_all kills this process.
    done = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), timeout=840)
    counts = {name: int(total) / steps for dump in sorted(folder.glob("callgrind.out.*"))
              for name, total in _DUMP.findall(dump.read_text(errors="replace"))}
    missing = [v for v in variants if v not in counts]
    if done.returncode != 0 or missing:
        text = log.read_text() if log.is_file() else ""
        raise RuntimeError(f"the child under valgrind failed (exit {done.returncode}; no count for {missing}):\n"
                           f"{done.stderr[-3000:]}\n{text[-2000:]}")
    return {v: counts[v] for v in variants}


def _child_env() -> dict[str, str]:
    from common import child_env

    return child_env(OMP_NUM_THREADS="1")


def measure(variants: tuple[str, ...], warmup: int, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        folder = Path(tmp)
        return count(variants, warmup, steps, build_marks(folder), folder)


def figures_for(per_step: dict[str, float]) -> list[dict[str, Any]]:
    from common import figure
    from overhead import LABELS

    raw = per_step["raw"]
    out = [figure("raw", LABELS["raw"], [raw], "instructions/step", role="baseline")]
    for name, value in per_step.items():
        if name == "raw":
            continue
        role = "reference" if name == "floor" else "lightning" if name.startswith("lightning") else "ours"
        out.append(figure(name, LABELS[name], [value], "instructions/step", role=role, baseline="raw",
                          ratios=[value / raw], deltas=[value - raw]))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="raw and ours only, fewer steps (about 1 minute)")
    parser.add_argument("--steps", type=int, default=None, help="steps counted (default 200, quick 20)")
    parser.add_argument("--warmup", type=int, default=None, help="steps run before counting (default 50)")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated, or 'all' (default {','.join(FULL_VARIANTS)}; quick: raw,ours); "
                             f"known: {','.join(ALL_VARIANTS)}")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lib", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = args.steps or (20 if args.quick else 200)
    warmup = args.warmup or 50  # fewer leave the first variant in a process still warming up (counted: +3 % at 10)
    if args.child:
        run_child(args.child.split(","), warmup, steps, args.lib)
        return 0
    missing = missing_tools()
    if missing:
        print(f"instructions.py needs {', '.join(missing)}", file=sys.stderr)
        return 2
    from common import lightning_version, machine_info, write_result
    from tables import figures_table

    variants = _chosen(args.variants, args.quick)
    if args.no_lightning or lightning_version() is None:
        variants = tuple(v for v in variants if not v.startswith("lightning"))
    started = time.perf_counter()
    per_step = measure(variants, warmup, steps)
    figures = figures_for(per_step)
    config = {"warmup_steps": warmup, "counted_steps": steps, "variants": list(variants), "batch_size": 64,
              "model": "MLP 32-64-64-1, SGD, 1 thread (overhead.py's workload)", "tool": "valgrind --tool=callgrind"}
    write_result(args.out, "instructions", figures, mode="quick" if args.quick else "full", config=config,
                 elapsed_s=time.perf_counter() - started,
                 machine=machine_info(lightning=lightning_version(), valgrind=valgrind_version()))
    print(figures_table(figures))
    return 0


def _chosen(spec: str | None, quick: bool) -> tuple[str, ...]:
    if not spec:
        return QUICK_VARIANTS if quick else FULL_VARIANTS
    names = ALL_VARIANTS if spec == "all" else tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in ALL_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(ALL_VARIANTS)}")
    return names if "raw" in names else ("raw", *names)  # every ratio is to the raw loop


def valgrind_version() -> str:
    return subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
