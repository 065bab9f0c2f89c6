"""Run the benchmark suite one benchmark after another, then regenerate docs/benchmarks.md from the results.

    python benchmarks/run_all.py                    # the full suite (what `make bench` runs; <= 15 min on 2 cores)
    python benchmarks/run_all.py --quick            # smaller and fewer rounds (< 3 min; CI runs it)
    python benchmarks/run_all.py --only overhead,import_time
    python benchmarks/run_all.py --only scale       # a study outside `make bench` (scale.py: about 10 minutes)
    python benchmarks/run_all.py --report           # no runs: regenerate the docs from the results there are
    python benchmarks/run_all.py --quick --results-dir /tmp/r --no-docs   # leave the repo untouched
    python benchmarks/run_all.py --quick --jobs 2   # two at once: a smoke run only (CI's test does this)

Each benchmark runs in its own Python process (this interpreter), never two at once unless `--jobs` says so
(quick mode only: figures taken side by side are not comparable), with this checkout
first on PYTHONPATH, and writes `<results-dir>/<name>.json`. `<results-dir>/suite.json` records what ran, how
long it took and how it ended. A benchmark whose script is absent, or that needs CUDA on a machine without
it, is recorded as not run; one that fails makes the exit status 1, after the others have run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from suite import BENCHMARKS, RESULTS, Benchmark, by_name

REPO = Path(__file__).resolve().parents[1]


def cuda_available() -> bool:
    """Asked in a child process, so this driver stays free of torch (and of CUDA state)."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True, timeout=300)
    return done.stdout.strip() == "True"


def run_one(bench: Benchmark, quick: bool, results_dir: Path, capture: bool = False) -> dict[str, Any]:
    """Run one benchmark's script; what happened, for suite.json. With `capture` (several at once) its output is
    printed in one block when it ends, not interleaved with the others'."""
    out = results_dir / f"{bench.name}.json"
    cmd = [sys.executable, str(bench.path), *bench.args(quick), "--out", str(out)]
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}
    print(f"\n=== {bench.name}: {' '.join(cmd[1:])}", flush=True)
    out.unlink(missing_ok=True)  # a failed run must not leave the previous result looking fresh
    started = time.perf_counter()
    try:
        # cwd: the results folder, so nothing a benchmark writes by relative path lands in the repo
        done = subprocess.run(cmd, cwd=results_dir, env=env, timeout=bench.timeout_s, capture_output=capture,
                              text=True)
        if capture:
            print(done.stdout + done.stderr, end="", flush=True)
        status = "ok" if done.returncode == 0 and out.is_file() else f"failed (exit status {done.returncode})"
    except subprocess.TimeoutExpired:
        status = f"failed (timed out after {bench.timeout_s} s)"
    seconds = time.perf_counter() - started
    print(f"=== {bench.name}: {status} in {seconds:.0f} s", flush=True)
    return {"status": status, "seconds": round(seconds, 1), "command": cmd[1:]}


def run_suite(benches: list[Benchmark], quick: bool, results_dir: Path, jobs: int = 1) -> dict[str, Any]:
    results_dir.mkdir(parents=True, exist_ok=True)
    suite_file = results_dir / "suite.json"
    previous = json.loads(suite_file.read_text()) if suite_file.is_file() else {}
    runs: dict[str, Any] = dict(previous.get("runs", {}))  # --only keeps what the other benchmarks last did
    has_cuda: bool | None = None
    started = time.perf_counter()
    runnable = []
    for bench in benches:
        if not bench.present:
            runs[bench.name] = {"status": f"not run (benchmarks/{bench.script} is not there yet)", "seconds": 0}
            continue
        if bench.missing_tools:
            runs[bench.name] = {"status": f"not run (needs {', '.join(bench.missing_tools)})", "seconds": 0}
            continue
        if bench.needs_cuda:
            has_cuda = cuda_available() if has_cuda is None else has_cuda
            if not has_cuda:
                runs[bench.name] = {"status": "not run (needs CUDA)", "seconds": 0}
                continue
        runnable.append(bench)

    def run(bench: Benchmark) -> dict[str, Any]:
        return {**run_one(bench, quick, results_dir, capture=jobs > 1), "mode": "quick" if quick else "full",
                "date": datetime.datetime.now().isoformat(timespec="seconds")}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for bench, outcome in zip(runnable, pool.map(run, runnable), strict=True):
            runs[bench.name] = outcome
    summary = {"mode": "quick" if quick else "full", "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "benchmarks": [b.name for b in benches], "seconds": round(time.perf_counter() - started, 1),
               "runs": runs}
    suite_file.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller and fewer rounds (< 3 minutes in all)")
    parser.add_argument("--only", default="", help="comma-separated names: " + ",".join(b.name for b in BENCHMARKS))
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help=f"where results go (default {RESULTS})")
    parser.add_argument("--no-docs", action="store_true", help="do not regenerate docs/benchmarks.md and its plots")
    parser.add_argument("--report", action="store_true", help="run nothing; regenerate the docs from the results")
    parser.add_argument("--jobs", type=int, default=1, help="benchmarks run at once (more than 1 needs --quick)")
    parser.add_argument("--docs", type=Path, default=None, help="the page to regenerate (default docs/benchmarks.md)")
    parser.add_argument("--img-dir", type=Path, default=None, help="where the plots go (default docs/img)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.jobs < 1 or (args.jobs > 1 and not args.quick):
        print(f"--jobs {args.jobs}: use 1, or more with --quick only (benchmarks run side by side slow each other "
              "down, so their figures are not comparable)", file=sys.stderr)
        return 2
    args.results_dir = args.results_dir.resolve()  # the benchmarks run inside it
    benches = by_name([n.strip() for n in args.only.split(",") if n.strip()]) if args.only else \
        [b for b in BENCHMARKS if b.in_suite]
    failed: list[str] = []
    if not args.report:
        summary = run_suite(benches, args.quick, args.results_dir, args.jobs)
        print(f"\nsuite ({summary['mode']}) took {summary['seconds']:.0f} s")
        for name in summary["benchmarks"]:
            run = summary["runs"][name]
            print(f"  {name:12s} {run['status']}  {run['seconds']:.0f} s")
        failed = [n for n in summary["benchmarks"] if summary["runs"][n]["status"].startswith("failed")]
    if not args.no_docs:
        import report  # matplotlib is imported there, only when the docs are made

        for path in report.generate(args.results_dir, docs=args.docs, img_dir=args.img_dir):
            print(f"wrote {path}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
