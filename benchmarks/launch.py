"""Launch to first step with `devices=2`: what a user waits for between `python train.py` and the first step.

Each measurement starts a fresh `python launch.py --child VARIANT` and takes the wall clock just before; rank 0
writes the wall clock when its first training step starts (the raw script: its first forward). The figure is the
difference: interpreter start, imports, the launch of the ranks, process-group set-up, the DDP wrap, loader set-up
and the first batch, on 2 CPU ranks with gloo. The workload is first_step.py's (an MLP 32-64-64-1 on 2,048
synthetic samples, batch 64 per rank, one thread per rank).

Variants: raw (a `torch.multiprocessing.spawn` script written the tutorial way: init_process_group, DDP,
DistributedSampler, loop); ours with `strategy="ddp_spawn"` (the same spawn mechanism); ours with `strategy="ddp"`
(the script re-runs itself for the other rank, as Lightning's default does). Interleaved rounds, the order rotated
by one each round, after one discarded warm-up round (byte-compiling, disk cache; not in quick mode).
Target: ours <= the raw script + 1.0 s.

    .venv/bin/python benchmarks/launch.py            # 5 rounds (about 3 minutes on 2 cores)
    .venv/bin/python benchmarks/launch.py --quick    # 1 round
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "launch.json"
TARGET_S = 1.0  # ours minus raw; reported against, never asserted
LABELS: dict[str, str] = {
    "raw": "raw mp.spawn DDP script, 2 ranks",
    "ours_spawn": "ours, strategy=\"ddp_spawn\", 2 ranks",
    "ours_ddp": "ours, strategy=\"ddp\" (script re-run), 2 ranks",
}


# --- the children ------------------------------------------------------------------------------------------
def _data_and_net() -> tuple[Any, Any]:
    import torch
    from torch.utils.data import TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 32), torch.randn(2048, 1))
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 1))
    return data, net


def _stamp(out: str) -> None:
    Path(out).write_text(repr(time.time()))


def _raw_rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    data, net = _data_and_net()
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data, num_replicas=2, rank=rank))
    for x, y in loader:
        if rank == 0:
            _stamp(out)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        break
    dist.destroy_process_group()


def child(variant: str, out: str) -> None:
    if variant == "raw":
        import torch.multiprocessing as mp

        from strategies.comm.distributed import find_free_port

        mp.spawn(_raw_rank, args=(find_free_port(), out), nprocs=2)
        return
    from _launch_module import LaunchModule

    from trainer import Trainer

    strategy = "ddp_spawn" if variant == "ours_spawn" else "ddp"
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, default_root_dir=str(Path(out).parent))
    trainer.fit(LaunchModule(*_data_and_net(), out))


# --- the parent: interleaved rounds ------------------------------------------------------------------------
def run_child(variant: str) -> float:
    """Seconds from just before the launch until rank 0's first step."""
    from common import child_env

    env = child_env(cached_bytecode=True, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory(prefix="launch-") as tmp:
        out = Path(tmp) / "first_step.txt"
        launched = time.time()
        done = subprocess.run([sys.executable, __file__, "--child", variant, "--stamp", str(out)],
                              capture_output=True, text=True, cwd=tmp, env=env, timeout=300)
        if not out.is_file():
            raise RuntimeError(f"launch child {variant} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        if done.returncode != 0:  # after its first step (e.g. the raw script's exit race): not what is measured
            print(f"note: {variant} exited with {done.returncode} after its first step", flush=True)
        return float(out.read_text()) - launched


def measure(names: list[str], rounds: int, warmup: bool) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(-1 if warmup else 0, rounds):
        shift = max(rnd, 0) % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = run_child(name)
            if rnd >= 0:
                runs[name].append(seconds)
        if rnd >= 0:
            print(f"round {rnd + 1}/{rounds}: " + ", ".join(f"{n} {runs[n][-1]:.2f} s" for n in names), flush=True)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, no warm-up round")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 5, quick 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    parser.add_argument("--child", choices=list(LABELS), help=argparse.SUPPRESS)
    parser.add_argument("--stamp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.stamp)
        return

    from common import figure, paired, write_result

    rounds = args.rounds or (1 if args.quick else 5)
    names = list(LABELS)
    started = time.perf_counter()
    runs = measure(names, rounds, warmup=not args.quick)
    raw = runs["raw"]
    figures = [figure("raw", LABELS["raw"], raw, "s", role="baseline")]
    for name in names[1:]:
        figures.append(figure(name, LABELS[name], runs[name], "s", baseline="raw", ratios=paired(runs[name], raw),
                              deltas=paired(runs[name], raw, "delta"), target=TARGET_S, target_on="delta"))
    for f in figures:
        print(f"{f['label']:55s} median {f['median']:6.2f} s  (min {f['min']:.2f}, max {f['max']:.2f})")
    write_result(args.out, "launch", figures, mode="quick" if args.quick else "full",
                 config={"rounds": rounds, "variants": names, "samples": 2048, "batch_size": 64},
                 elapsed_s=time.perf_counter() - started)


if __name__ == "__main__":
    main()
