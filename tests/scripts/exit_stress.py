"""Does every finished 2-rank run exit 0 on every rank? Launch a tiny fit many times and count the runs that end
badly: a non-zero exit code, an abort line (`terminate called ...`, SIGABRT), a process that outlives its launch,
a hang, or a rank that never reached the code after `fit()`.

    python tests/scripts/exit_stress.py                       # every mode, STRESS_N runs each (default 2)
    STRESS_N=100 python tests/scripts/exit_stress.py --parallel 2 --json stress.json    # the full mode
    python tests/scripts/exit_stress.py --modes raw_spawn,raw_torchrun --n 30            # the raw-torch baseline

Modes: ddp (our launcher re-runs the script), ddp_spawn, torchrun (one node, 2 workers), torchrun_2node (two
torchrun agents on localhost), manual_2node (MASTER_ADDR/MASTER_PORT/NODE_RANK, no launcher); and the baseline
raw_spawn / raw_torchrun: a hand-written DDP script that leaves its process group to interpreter shutdown.
`--parallel` runs that many launches at once (load, as on a busy CI machine). `--amplify` compiles
tests/scripts/slow_gloo_worker.c (needs a C compiler) and preloads it into every rank: a gloo worker thread about
to take the GIL then waits until interpreter finalization has begun (200 ms at most), which makes the exit race
that a finished run must survive happen every time (the raw modes then abort in every run). Exit code 1 when a
product mode (not a raw one) had an abnormal run; every abnormal run's exit codes and last output lines are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from strategies.comm.distributed import find_free_port  # noqa: E402
from tests.helpers.launch import ABORT_MARKERS, TORCHRUN, launch, report  # noqa: E402
from tests.helpers.launch import clean_env as launch_env  # noqa: E402

FIT = str(ROOT / "tests" / "scripts" / "exit_fit.py")
PRODUCT_MODES = ("ddp", "ddp_spawn", "torchrun", "torchrun_2node", "manual_2node")
RAW_MODES = ("raw_spawn", "raw_torchrun")
LAUNCH_TIMEOUT_S = 90.0


AMPLIFIER = ROOT / "tests" / "scripts" / "slow_gloo_worker.c"
EXTRA_ENV: dict[str, str] = {}  # set by --amplify: every launched process preloads the amplifier


def build_amplifier(folder: Path) -> Path | None:
    """Compile the slow-gloo-worker library; None when there is no C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    lib = folder / "libslowgloo.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(lib), str(AMPLIFIER), "-ldl", "-lpthread"],
                   check=True, capture_output=True)
    return lib


def clean_env(**extra: str) -> dict[str, str]:
    return launch_env(**extra, **EXTRA_ENV)


def _commands(mode: str, out: Path) -> tuple[list[tuple[list[str], dict[str, str]]], int]:
    """The commands of one launch and how many processes print AFTER_FIT."""
    py, port = [sys.executable, FIT, "--out", str(out)], str(find_free_port())
    if mode in ("ddp", "ddp_spawn"):
        return [([*py, "--strategy", mode], clean_env(MASTER_PORT=port))], 2 if mode == "ddp" else 1
    if mode in ("torchrun", "raw_torchrun"):
        extra = ["--raw"] if mode == "raw_torchrun" else []
        cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", FIT, "--out", str(out), *extra]
        return [(cmd, clean_env())], 2
    if mode == "torchrun_2node":
        return [([*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node), "--master_addr",
                  "127.0.0.1", "--master_port", port, FIT, "--out", str(out), "--devices", "1", "--num-nodes", "2"],
                 clean_env()) for node in range(2)], 2
    if mode == "manual_2node":
        return [([*py, "--devices", "1", "--num-nodes", "2"], clean_env(MASTER_PORT=port, NODE_RANK=str(node)))
                for node in range(2)], 2
    if mode == "raw_spawn":
        return [([*py, "--raw"], clean_env())], 1
    raise ValueError(f"unknown mode {mode!r}; use one of {PRODUCT_MODES + RAW_MODES}")


@dataclass
class RunOutcome:
    mode: str
    index: int
    problems: list[str] = field(default_factory=list)
    returncodes: list[int] = field(default_factory=list)
    tail: str = ""
    seconds: float = 0.0


def run_once(mode: str, index: int, workdir: Path) -> RunOutcome:
    out = workdir / f"{mode}-{index}"
    commands, expected_after = _commands(mode, out)
    outcome = RunOutcome(mode, index)
    start = time.monotonic()
    try:
        results = launch(commands, out, timeout=LAUNCH_TIMEOUT_S)
    except AssertionError as err:  # processes outlived the launch (launch() killed them)
        outcome.problems.append("survivor")
        outcome.tail = str(err)[-2000:]
        return outcome
    except BaseException as err:  # pytest.fail on timeout: a hang (launch() killed everything)
        if isinstance(err, KeyboardInterrupt):
            raise
        outcome.problems.append("hang")
        outcome.tail = str(err)[-3000:]
        return outcome
    outcome.seconds = time.monotonic() - start
    outcome.returncodes = [r.returncode for r in results]
    text = "\n".join(r.output for r in results)
    if any(code != 0 for code in outcome.returncodes):
        outcome.problems.append("exit code")
    if any(marker in text for marker in ABORT_MARKERS):
        outcome.problems.append("abort")
    if text.count("AFTER_FIT") != expected_after or text.count("RANK_DONE") != 2:
        outcome.problems.append("incomplete")
    if outcome.problems:
        outcome.tail = "\n".join(report(i, r, lines=25) for i, r in enumerate(results))
    return outcome


def stress(modes: list[str], n: int, parallel: int, workdir: Path) -> list[RunOutcome]:
    jobs = [(mode, i) for i in range(n) for mode in modes]  # interleaved: the load mixes modes
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(lambda job: run_once(job[0], job[1], workdir), jobs))


def run_stress(modes: list[str], n: int, parallel: int, amplify: bool = False) -> list[RunOutcome]:
    """`n` launches of every mode in a temporary folder; with `amplify`, every rank preloads the amplifier."""
    with tempfile.TemporaryDirectory(prefix="exit_stress-") as tmp:
        EXTRA_ENV.clear()
        if amplify:
            lib = build_amplifier(Path(tmp))
            if lib is None:
                raise RuntimeError("the amplifier needs a C compiler (cc or gcc)")
            EXTRA_ENV["LD_PRELOAD"] = str(lib)
        try:
            return stress(modes, n, parallel, Path(tmp))
        finally:
            EXTRA_ENV.clear()


def summarize(outcomes: list[RunOutcome], modes: list[str]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for mode in modes:
        mine = [o for o in outcomes if o.mode == mode]
        row = {"runs": len(mine), "abnormal": sum(bool(o.problems) for o in mine)}
        for kind in ("exit code", "abort", "survivor", "hang", "incomplete"):
            row[kind] = sum(kind in o.problems for o in mine)
        table[mode] = row
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(PRODUCT_MODES + RAW_MODES))
    parser.add_argument("--n", type=int, default=int(os.environ.get("STRESS_N", "2")), help="runs per mode")
    parser.add_argument("--parallel", type=int, default=2, help="launches at once")
    parser.add_argument("--json", help="write the counts and every abnormal run here")
    parser.add_argument("--amplify", action="store_true", help="preload tests/scripts/slow_gloo_worker.c")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        _commands(mode, Path("/nonexistent"))  # an unknown mode fails before anything runs
    if args.amplify and not (shutil.which("cc") or shutil.which("gcc")):
        print("--amplify needs a C compiler (cc or gcc); none found")
        return 2
    start = time.monotonic()
    outcomes = run_stress(modes, args.n, args.parallel, args.amplify)
    table = summarize(outcomes, modes)
    bad = [o for o in outcomes if o.problems]
    for o in bad:
        print(f"=== {o.mode} run {o.index}: {', '.join(o.problems)}; exit codes {o.returncodes}\n{o.tail}\n")
    print(f"{'mode':<16}{'runs':>6}{'abnormal':>10}  (exit code / abort / survivor / hang / incomplete)")
    for mode, row in table.items():
        print(f"{mode:<16}{row['runs']:>6}{row['abnormal']:>10}  ({row['exit code']} / {row['abort']} / "
              f"{row['survivor']} / {row['hang']} / {row['incomplete']})")
    amplified = ", amplified" if args.amplify else ""
    print(f"{len(outcomes)} launches, parallel {args.parallel}{amplified}, {time.monotonic() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": table, "parallel": args.parallel, "n": args.n,
                                               "amplified": args.amplify,
                                               "abnormal": [asdict(o) for o in bad]}, indent=2))
    return 1 if any(o.mode in PRODUCT_MODES for o in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
