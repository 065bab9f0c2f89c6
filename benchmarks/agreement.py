"""Cost of the per-step control-plane agreement (trainer/ranks/agreement.py) on the DDP benchmark model.

On 2 CPU ranks joined by gloo, one thread per rank:

- in the fit: benchmarks/ddp.py's workload (MLP 256-1024-1024-10, batch 64 per rank, `ddp_spawn`) with the
  agreement every step (the default); rank 0 clocks the time it spends inside the agreement's calls (starting the
  overlapped round after training_step, waiting for it after backward; benchmarks/_agreement_probe.py). That time
  per step, over the median step time, is the headline `cost_pct`: what the step waits for the agreement. Both
  ranks are on this machine, so the round goes through the shared-memory board (strategies/comm/agreement_board.py);
  the same fit with the board off (the round as a gloo all-reduce, as ranks on several machines have it) is
  clocked beside it;
- micro: one blocking agreement (an all-reduce, MAX, of 10 int64), timed over many calls after a barrier: what a
  synchronous round would cost per step (the design before the overlap);
- A/B: the same fit with `agree_every_n_steps=1` (board, and gloo round) and with a huge interval (only each
  epoch's last batch), in interleaved rounds; the paired ratios of median step times. On 2 shared cores their noise
  is of the order of the cost; they show the CPU that a gloo round's threads take from the step, which the time in
  the calls does not count and no overlap hides.

Target: cost <= 1 % of step time.

    .venv/bin/python benchmarks/agreement.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _agreement_probe import NO_BOARD_VAR, AgreementTimer
from common import figure, paired, steady_intervals, write_result
from ddp import TRAINER_FLAGS, BenchModule, Config

from strategies.comm.distributed import all_reduce_max_ints, find_free_port
from trainer import Trainer
from trainer.ranks.agreement import keys_hash

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "agreement.json"
TARGET_PCT = 1.0
NEVER = 10**9


def _micro_worker(rank: int, port: int, calls: int, out_file: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    flags = [0] * 10
    for _ in range(50):  # warm-up
        all_reduce_max_ints(flags)
    dist.barrier()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        flags[5] = keys_hash([])  # what a step does besides the all-reduce
        all_reduce_max_ints(flags)
        times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out_file).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure_micro(calls: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "micro.json")
        mp.spawn(_micro_worker, args=(find_free_port(), calls, out_file), nprocs=2, join=True)
        return json.loads(Path(out_file).read_text())


def fit_step_times(cfg: Config, every: int, board: bool = True) -> tuple[list[float], list[float]]:
    """Steady step intervals of rank 0, and the seconds it spent in the agreement's calls in each of those steps.
    `board=False`: the ranks open no shared-memory board (the spawned ranks inherit the variable)."""
    timer = AgreementTimer()
    trainer = Trainer(devices=2, strategy="ddp_spawn", max_epochs=cfg.epochs, callbacks=[timer],
                      agree_every_n_steps=every, **TRAINER_FLAGS)
    os.environ[NO_BOARD_VAR] = "0" if board else "1"
    try:
        trainer.fit(BenchModule(cfg))
    finally:
        os.environ.pop(NO_BOARD_VAR)
    skip = cfg.warmup_steps + 1
    print(f"    median in the agreement per step: {statistics.median(timer.spent[skip:]) * 1e6:.0f} us, of which "
          f"waiting for the overlapped round {statistics.median(timer.waited[skip:]) * 1e6:.0f} us", flush=True)
    return steady_intervals(timer.clock.wall, cfg.warmup_steps), timer.spent[skip:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few calls, 1 round, small data")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    cfg = Config(samples=2_560, rounds=1, warmup_steps=5) if args.quick else Config(rounds=6)
    calls = 500 if args.quick else 5_000

    started = time.perf_counter()
    micro = measure_micro(calls)
    micro_us = statistics.median(micro) * 1e6
    print(f"agreement all-reduce: {micro_us:.1f} us median over {calls} calls", flush=True)
    variants = [("board", 1, True), ("gloo", 1, False), ("off", NEVER, True)]
    step_rounds: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    spent_rounds: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for rnd in range(cfg.rounds):
        k = rnd % len(variants)
        for name, every, board in variants[k:] + variants[:k]:  # rotated each round
            steps, spent = fit_step_times(cfg, every, board)
            med = statistics.median(steps)
            step_rounds[name].append(med)
            spent_rounds[name].append(statistics.median(spent))
            print(f"round {rnd + 1}/{cfg.rounds} {name}, agree_every_n_steps={every}: {med * 1e3:.2f} ms/step, "
                  f"{statistics.median(spent) * 1e6:.0f} us/step in the agreement", flush=True)
    on_rounds, gloo_rounds, off_rounds = step_rounds["board"], step_rounds["gloo"], step_rounds["off"]
    step_ms = statistics.median(on_rounds) * 1e3
    spent_us = statistics.median(spent_rounds["board"]) * 1e6
    cost_pct = spent_us / 1e3 / step_ms * 100
    figures = [
        figure("spent_us", "step time spent in the agreement (post + read, rank 0; shared-memory board)",
               [t * 1e6 for t in spent_rounds["board"]], "µs"),
        figure("spent_gloo_us", "step time spent in the agreement as a gloo round (start + wait; board off)",
               [t * 1e6 for t in spent_rounds["gloo"]], "µs", role="reference"),
        figure("agreement_us", "one blocking agreement (10-int MAX all-reduce, gloo, 2 ranks)",
               [t * 1e6 for t in micro], "µs", role="reference"),
        figure("step_without", "DDP step, agreement only at epoch ends", [t * 1e3 for t in off_rounds], "ms/step",
               role="baseline"),
        figure("step_with", "DDP step, agreement every step (default: shared-memory board)",
               [t * 1e3 for t in on_rounds], "ms/step", baseline="step_without", ratios=paired(on_rounds, off_rounds)),
        figure("step_with_gloo", "DDP step, agreement every step as a gloo round (board off)",
               [t * 1e3 for t in gloo_rounds], "ms/step", baseline="step_without",
               ratios=paired(gloo_rounds, off_rounds)),
        figure("cost_pct", "agreement cost, % of the step (time in it / step)", [cost_pct], "%", target=TARGET_PCT,
               target_on="value"),
    ]
    write_result(args.out, "agreement", figures, mode="quick" if args.quick else "full",
                 config={"calls": calls, "rounds": cfg.rounds, "samples": cfg.samples, "batch_size": cfg.batch_size},
                 elapsed_s=time.perf_counter() - started)
    verdict = "met" if cost_pct <= TARGET_PCT else "missed"
    print(f"agreement: {spent_us:.1f} us per step = {cost_pct:.2f} % of a {step_ms:.2f} ms step (target <= "
          f"{TARGET_PCT} %: {verdict})", flush=True)


if __name__ == "__main__":
    main()
