"""Instructions per step on rank 0 of the DDP benchmark, counted by callgrind: the work DDP's rank 0 does, without the
noise that two ranks on two shared cores put into its time.

`ddp.py` times our Trainer against the tutorial's DDP script on 2 gloo ranks, and on 2 cores the rounds of that
comparison swing by more than its 3 % target. This script counts instead. For each variant (the raw script, ours,
Lightning when installed) it starts the two ranks as separate processes that meet through torch's env rendezvous
(`MASTER_ADDR`, `RANK`, ...): rank 1 runs plainly, rank 0 under `valgrind --tool=callgrind --instr-atstart=no
--separate-threads=yes`. Instrumentation goes on at rank 0's first counted step and off after its last (the client
requests of `callgrind_marks.c`, as in instructions.py), so the counts cover exactly those steps, in every thread of
rank 0: the main thread that runs the step, and gloo's threads that carry the gradient all-reduce and our per-step
agreement. Both ranks leave with `os._exit` after the last counted step: nothing after it is measured, and a slow
teardown under valgrind is not waited for.

Ours runs `Trainer(strategy="ddp", devices=2)` from the env rendezvous (as under torchrun), not `ddp_spawn`:
valgrind follows one process, and spawning the ranks from inside it would put both under it. The step is the same.
Lightning's `Trainer(strategy="ddp", devices=2)` likewise: with `LOCAL_RANK` set it launches nothing itself.

Rank 0 runs about 50 times slower under callgrind, so rank 1 waits for it in every all-reduce; what is counted is
work, not waiting. Not part of `make bench`: each variant takes about 8-9 minutes on one core of the development
machine.

    .venv/bin/python benchmarks/ddp_instructions.py                # 10 uncounted, then 20 counted steps
    .venv/bin/python benchmarks/ddp_instructions.py --steps 40
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import child_env, figure

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "ddp_instructions.json"
VARIANTS = {"raw": "raw DDP script, rank 0", "ours": "ours, strategy='ddp', rank 0",
            "lightning": "Lightning, strategy='ddp', rank 0"}
_TOTALS = re.compile(r"^totals: (\d+)$", re.MULTILINE)
_MAIN = re.compile(r"^desc: Trigger: Client Request: \w+$", re.MULTILINE)


# --- one rank ---------------------------------------------------------------------------------------------------
def run_rank(variant: str, warmup: int, steps: int, lib_path: str) -> None:
    """One rank of `variant`; rank 0 marks its counted steps when it runs under valgrind; both leave after them."""
    import torch

    torch.set_num_threads(1)
    import ddp
    from common import StepClock

    rank = int(os.environ["RANK"])
    marks = ctypes.CDLL(lib_path)
    counting = rank == 0 and bool(marks.marks_on_valgrind())

    class MarkingClock(StepClock):
        def tick(self) -> None:
            super().tick()
            if len(self.wall) == warmup and counting:
                marks.marks_start()
            elif len(self.wall) == warmup + steps:
                if counting:
                    marks.marks_stop(variant.encode())
                sys.stdout.flush()
                os._exit(0)

    batch = ddp.Config().batch_size
    cfg = ddp.Config(samples=ddp.WORLD_SIZE * batch * (warmup + steps + 2), epochs=1)  # ends after the counted steps
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch._dynamo's import, before either variant
    if variant == "raw":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        ddp.raw_loop(rank, dist.get_world_size(), cfg, MarkingClock())
    elif variant == "lightning":
        _run_lightning(cfg, MarkingClock())
    else:
        from callbacks import Callback
        from trainer import Trainer

        class Marking(Callback):
            def __init__(self) -> None:
                self.clock = MarkingClock()

            def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
                self.clock.tick()

        trainer = Trainer(devices=ddp.WORLD_SIZE, strategy="ddp", max_epochs=1, callbacks=[Marking()],
                          **ddp.TRAINER_FLAGS)
        trainer.fit(ddp.BenchModule(cfg))
    raise SystemExit(f"{variant}: the data ended before step {warmup + steps}")


def _run_lightning(cfg: Any, clock: Any) -> None:
    """Lightning's `Trainer(strategy="ddp", devices=2)` on ddp.py's workload, from the env rendezvous: with LOCAL_RANK
    set, Lightning takes the processes as launched from outside (as under torchrun) and starts none."""
    import logging

    import ddp
    import lightning.pytorch as pl
    from _ddp_lightning import LitBenchModule

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    class Marking(pl.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            clock.tick()

    trainer = pl.Trainer(devices=ddp.WORLD_SIZE, strategy="ddp", max_epochs=1, callbacks=[Marking()],
                         **ddp.TRAINER_FLAGS)
    trainer.fit(LitBenchModule(cfg, ddp.make_mlp, ddp.make_data))


# --- the parent ---------------------------------------------------------------------------------------------------
def count(variant: str, warmup: int, steps: int, lib: Path, folder: Path) -> dict[str, float]:
    """Rank 0's instructions per counted step of `variant`: its main thread's, and all its threads' together."""
    from strategies.comm.distributed import find_free_port

    out = folder / f"{variant}.callgrind"
    env = child_env(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()), WORLD_SIZE="2",
                    LOCAL_WORLD_SIZE="2")
    child = [sys.executable, str(Path(__file__).resolve()), "--rank-of", variant, "--warmup", str(warmup),
             "--steps", str(steps), "--lib", str(lib)]
    rank1 = subprocess.Popen(child, env={**env, "RANK": "1", "LOCAL_RANK": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        rank0 = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                                f"--callgrind-out-file={out}", f"--log-file={folder / 'valgrind.log'}", *child],
                               env={**env, "RANK": "0", "LOCAL_RANK": "0"}, capture_output=True, text=True,
                               timeout=5400)  # under valgrind on a busy 2-core machine a variant took over 25 min
        rank1_err = rank1.communicate(timeout=120)[1]
    finally:
        rank1.kill()
    dumps = [dump.read_text(errors="replace") for dump in folder.glob(f"{variant}.callgrind*")]
    if rank0.returncode != 0 or rank1.returncode != 0:
        raise RuntimeError(f"{variant}: rank 0 exit {rank0.returncode}, rank 1 exit {rank1.returncode}:\n"
                           f"{rank0.stderr[-2000:]}\n{rank1_err[-2000:]}")
    return per_step(dumps, steps)


def per_step(dumps: list[str], steps: int) -> dict[str, float]:
    """Per counted step: the main thread's count (its dump is the one the client request wrote) and the sum over
    every thread's dump (the others are written when the process ends; instrumentation was off after the steps)."""
    main = [int(t) for d in dumps if _MAIN.search(d) for t in _TOTALS.findall(d)]
    if len(main) != 1:
        raise RuntimeError(f"expected one dump written by the client request, found {len(main)}")
    return {"main": main[0] / steps, "all": sum(int(t) for d in dumps for t in _TOTALS.findall(d)) / steps}


def measure(variants: list[str], warmup: int, steps: int, lib: Path, folder: Path) -> dict[str, dict[str, float]]:
    """Rank 0's counts per variant, one 2-rank run each (instructions.py's `--ddp` calls this too)."""
    return {variant: count(variant, warmup, steps, lib, folder) for variant in variants}


def figures_for(counts: dict[str, dict[str, float]], prefix: str = "") -> list[dict[str, Any]]:
    """Every thread's and the main thread's counts, each against the raw script's; names start with `prefix`."""
    raw = counts["raw"]
    out = []
    for part, words in (("all", "every thread"), ("main", "the main thread")):
        out.append(figure(f"{prefix}raw_{part}", f"{VARIANTS['raw']}, {words}", [raw[part]], "instructions/step",
                          role="baseline"))
        for variant in (v for v in counts if v != "raw"):
            value = counts[variant][part]
            role = "lightning" if variant == "lightning" else "ours"
            out.append(figure(f"{prefix}{variant}_{part}", f"{VARIANTS[variant]}, {words}", [value],
                              "instructions/step", role=role, baseline=f"{prefix}raw_{part}",
                              ratios=[value / raw[part]], deltas=[value - raw[part]]))
    return out


def chosen_variants(with_lightning: bool) -> list[str]:
    """raw and ours, and Lightning when asked for and installed."""
    from common import lightning_version

    return ["raw", "ours"] + (["lightning"] if with_lightning and lightning_version() is not None else [])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps counted (default 20)")
    parser.add_argument("--warmup", type=int, default=10, help="steps run before counting (default 10)")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    parser.add_argument("--rank-of", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lib", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_of:
        run_rank(args.rank_of, args.warmup, args.steps, args.lib)
        return 0
    from instructions import build_marks, missing_tools, valgrind_version

    missing = missing_tools()
    if missing:
        print(f"ddp_instructions.py needs {', '.join(missing)}", file=sys.stderr)
        return 2
    from common import lightning_version, machine_info, write_result
    from tables import figures_table

    started = time.perf_counter()
    variants = chosen_variants(not args.no_lightning)
    with tempfile.TemporaryDirectory(prefix="ddp-instructions-") as tmp:
        folder = Path(tmp)
        counts = measure(variants, args.warmup, args.steps, build_marks(folder), folder)
    figures = figures_for(counts)
    config = {"warmup_steps": args.warmup, "counted_steps": args.steps, "ranks": 2, "counted_rank": 0,
              "model": "MLP 256-1024-1024-10, SGD, batch 64 per rank, 1 thread (ddp.py's workload)",
              "tool": "valgrind --tool=callgrind --separate-threads=yes"}
    write_result(args.out, "ddp_instructions", figures, mode="full", config=config,
                 elapsed_s=time.perf_counter() - started,
                 machine=machine_info(valgrind=valgrind_version(), lightning=lightning_version()))
    print(figures_table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
