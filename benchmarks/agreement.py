"""Cost of the per-step control-plane agreement (trainer/control.py) on the DDP benchmark model.

On 2 CPU ranks joined by gloo, one thread per rank:

- in the fit: benchmarks/ddp.py's workload (MLP 256-1024-1024-10, batch 64 per rank, `ddp_spawn`) with the
  agreement every step (the default); rank 0 clocks the time it spends inside the agreement's calls (starting the
  overlapped round after training_step, waiting for it after backward; benchmarks/_agreement_probe.py). That time
  per step, over the median step time, is the headline `cost_pct`: what the step waits for the agreement;
- micro: one blocking agreement (an all-reduce, MAX, of 10 int64), timed over many calls after a barrier: what a
  synchronous round would cost per step (the design before the overlap);
- A/B: the same fit with `agree_every_n_steps=1` and with a huge interval (only each epoch's last batch), in
  interleaved rounds; the paired ratio of median step times. On 2 shared cores its noise is larger than the cost;
  it is a cross-check that shows the CPU the round's threads take from the step, which no overlap hides.

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
from _agreement_probe import AgreementTimer
from common import figure, paired, steady_intervals, write_result
from ddp import TRAINER_FLAGS, BenchModule, Config

from strategies.distributed import all_reduce_max_ints, find_free_port
from trainer import Trainer
from trainer.control import keys_hash

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


def fit_step_times(cfg: Config, every: int) -> tuple[list[float], list[float]]:
    """Steady step intervals of rank 0, and the seconds it spent in the agreement's calls in each of those steps."""
    timer = AgreementTimer()
    trainer = Trainer(devices=2, strategy="ddp_spawn", max_epochs=cfg.epochs, callbacks=[timer],
                      agree_every_n_steps=every, **TRAINER_FLAGS)
    trainer.fit(BenchModule(cfg))
    skip = cfg.warmup_steps + 1
    print(f"    median in the agreement per step: {statistics.median(timer.spent[skip:]) * 1e6:.0f} us, of which "
          f"waiting for the overlapped round {statistics.median(timer.waited[skip:]) * 1e6:.0f} us", flush=True)
    return steady_intervals(timer.clock.wall, cfg.warmup_steps), timer.spent[skip:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few calls, 1 round, small data")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    cfg = Config(samples=2_560, rounds=1, warmup_steps=5) if args.quick else Config(rounds=5)
    calls = 500 if args.quick else 5_000

    started = time.perf_counter()
    micro = measure_micro(calls)
    micro_us = statistics.median(micro) * 1e6
    print(f"agreement all-reduce: {micro_us:.1f} us median over {calls} calls", flush=True)
    on_rounds, off_rounds, spent_rounds = [], [], []
    for rnd in range(cfg.rounds):
        order = [1, NEVER] if rnd % 2 == 0 else [NEVER, 1]
        for every in order:
            steps, spent = fit_step_times(cfg, every)
            med = statistics.median(steps)
            (on_rounds if every == 1 else off_rounds).append(med)
            if every == 1:
                spent_rounds.append(statistics.median(spent))
            print(f"round {rnd + 1}/{cfg.rounds} agree_every_n_steps={every}: {med * 1e3:.2f} ms/step"
                  + (f", {statistics.median(spent) * 1e6:.0f} us/step in the agreement" if every == 1 else ""),
                  flush=True)
    step_ms = statistics.median(on_rounds) * 1e3
    spent_us = statistics.median(spent_rounds) * 1e6
    cost_pct = spent_us / 1e3 / step_ms * 100
    figures = [
        figure("spent_us", "step time spent in the agreement (start + wait, rank 0)", [t * 1e6 for t in spent_rounds],
               "µs"),
        figure("agreement_us", "one blocking agreement (10-int MAX all-reduce, gloo, 2 ranks)",
               [t * 1e6 for t in micro], "µs", role="reference"),
        figure("step_without", "DDP step, agreement only at epoch ends", [t * 1e3 for t in off_rounds], "ms/step",
               role="baseline"),
        figure("step_with", "DDP step, agreement every step (default)", [t * 1e3 for t in on_rounds], "ms/step",
               baseline="step_without", ratios=paired(on_rounds, off_rounds)),
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
