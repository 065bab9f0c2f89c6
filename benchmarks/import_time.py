"""Import time: `import trainer` against `import torch` (its floor) and `import lightning.pytorch`.

Each measurement is a fresh Python process (`python -c`) that times its one import statement with
`time.perf_counter()` around it, so interpreter start-up is left out and every process starts with nothing
imported. Statements run in interleaved rounds (one discarded warm-up round first, which also fills the
disk cache), in an order rotated by one each round, so drift in machine speed falls on all alike. The
overhead of `import trainer` over torch is the median over rounds of (trainer - torch) within a round;
target: <= 0.15 s. The whole process's wall time, as seen from outside, is kept in the JSON file beside it.

One more process runs `python -X importtime -c "import torch; import trainer"`: the modules imported after
torch are what `import trainer` adds; the result file keeps, top-down, the framework's modules taking at least
5% of that time and the outside modules they import directly that do, so the docs can say where it goes.

    .venv/bin/python benchmarks/import_time.py            # 10 rounds (about 1-2 minutes)
    .venv/bin/python benchmarks/import_time.py --quick    # 3 rounds, no warm-up round
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import figure, lightning_version, machine_info, paired, write_result

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "import_time.json"
TARGET_S = 0.15  # import trainer minus import torch
STATEMENTS: dict[str, str] = {
    "torch": "import torch",
    "trainer": "import trainer",
    "lightning": "import lightning.pytorch",
}
CHILD = "import time; t = time.perf_counter(); {stmt}; print(repr(time.perf_counter() - t))"


def _env() -> dict[str, str]:
    """Bytecode cached as a user's Python caches it; the warm-up round writes the cache. (Without: +0.2 s in one run,
    the modules edited since their last cached bytecode compiled again in every round.)"""
    from common import child_env

    return child_env(cached_bytecode=True)


def time_import(stmt: str) -> tuple[float, float]:
    """(seconds inside the child for the import, wall seconds of the whole child process)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD.format(stmt=stmt)], capture_output=True, text=True,
                          cwd=REPO, env=_env(), timeout=300)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"`{stmt}` failed:\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1]), wall


def measure(names: list[str], rounds: int,
            warmup: bool = True) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Import and process seconds per statement, one per round (after a discarded warm-up round)."""
    inside: dict[str, list[float]] = {n: [] for n in names}
    process: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(-1 if warmup else 0, rounds):
        shift = max(rnd, 0) % len(names)
        for name in names[shift:] + names[:shift]:
            seconds, wall = time_import(STATEMENTS[name])
            if rnd >= 0:
                inside[name].append(seconds)
                process[name].append(wall)
        if rnd >= 0:
            print(f"round {rnd + 1}/{rounds}: " + ", ".join(f"{n} {inside[n][-1]:.3f} s" for n in names), flush=True)
    return inside, process


def _ours(module: str) -> bool:
    return module.split(".")[0] in ("trainer", "strategies", "callbacks")


def import_tree(share: float = 0.05) -> dict[str, Any]:
    """What `import trainer` imports beyond torch, top-down: the framework's modules taking at least `share`
    of that time, and the outside modules they import directly that do."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch; import trainer"],
                          capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300)
    rows = []  # (module, depth, self us, cumulative us), in the order Python logs them: children before parents
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_part, cumulative_us, name = line.split("|")
        name = name[1:].rstrip()
        rows.append((name.strip(), (len(name) - len(name.lstrip())) // 2, int(self_part.split(":")[1]),
                     int(cumulative_us)))
    tops = [i for i, r in enumerate(rows) if r[0] == "torch" and r[1] == 0]  # torch's line closes its tree
    rows = rows[tops[-1] + 1:] if tops else rows
    total = sum(r[2] for r in rows)
    kept = []
    for i, (module, depth, self_us, cumulative_us) in enumerate(rows):
        parent = next((r[0] for r in rows[i + 1:] if r[1] == depth - 1), "")
        if cumulative_us >= share * total and (_ours(module) or _ours(parent)):
            kept.append({"module": module, "depth": depth, "self_s": self_us / 1e6,
                         "cumulative_s": cumulative_us / 1e6})
    return {"total_s": total / 1e6, "share": share, "modules": kept[::-1]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, no warm-up round")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 10, quick 3)")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 10)
    names = ["torch", "trainer"]
    if not args.no_lightning and lightning_version() is not None:
        names.append("lightning")
    started = time.perf_counter()
    inside, process = measure(names, rounds, warmup=not args.quick)
    tree = import_tree()
    elapsed = time.perf_counter() - started

    figures = [figure("torch", "import torch", inside["torch"], "s", role="baseline")]
    for name in names[1:]:
        figures.append(figure(
            name, STATEMENTS[name], inside[name], "s", role="ours" if name == "trainer" else "lightning",
            baseline="torch", ratios=paired(inside[name], inside["torch"]),
            deltas=paired(inside[name], inside["torch"], "delta"),
            target=TARGET_S if name == "trainer" else None, target_on="delta",
        ))
    for f in figures:
        over = f"  (+{f['delta']:.3f} s over torch)" if f["delta"] is not None else ""
        print(f"{f['label']:28s} median {f['median']:.3f} s  min {f['min']:.3f}  max {f['max']:.3f}{over}")
    print("what `import trainer` adds beyond torch (>= 5% of it):")
    for m in tree["modules"]:
        print(f"  {'  ' * m['depth']}{m['module']}: {m['cumulative_s']:.3f} s")
    write_result(
        args.out, "import_time", figures, mode="quick" if args.quick else "full",
        config={"rounds": rounds, "statements": {n: STATEMENTS[n] for n in names}, "target_s": TARGET_S},
        elapsed_s=elapsed, machine=machine_info(lightning=lightning_version()),
        rounds_s=inside, process_wall_s={n: [round(x, 4) for x in v] for n, v in process.items()},
        process_wall_median_s={n: round(statistics.median(v), 4) for n, v in process.items()},
        import_tree=tree,
    )


if __name__ == "__main__":
    main()
