"""DDP step time: our Trainer's "ddp_spawn" against a raw DDP script built like PyTorch's DDP tutorial.

Both sides train the same MLP (256-1024-1024-10, 1.3 M parameters, cross-entropy, plain SGD) on the same
seeded synthetic data, with batch 64 per rank, on 2 CPU ranks joined by gloo on 127.0.0.1:

- raw: `torch.multiprocessing.spawn` + `init_process_group("gloo")` + `DistributedSampler` (with
  `set_epoch` every epoch) + `DistributedDataParallel`, the loop written by hand (the classic tutorial);
- ours: a TrainModule fitted by `Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", ...)` with
  every extra switched off; the Trainer injects the DistributedSampler itself;
- ours, 1 rank: the same TrainModule with `devices=1` (single device, in this process), for the
  1-rank vs 2-rank throughput;
- Lightning (when installed): the same module as a LightningModule, `pl.Trainer(strategy="ddp_spawn",
  devices=2)` with the same flags off (benchmarks/_ddp_lightning.py; rank 0 writes its stamps to a file).

Every rank runs one thread (`OMP_NUM_THREADS=1`, `torch.set_num_threads(1)`). Per-step time is stamped on
rank 0 after the optimizer step (raw: in the loop; ours: a Callback's `on_train_batch_end`), the first
`warmup_steps` intervals of each fit are dropped and the median of the rest is taken. Variants run in
interleaved rounds with a rotated order (raw, ours, ours-1, then ours, ours-1, raw, ...), each fit in fresh
processes, so drift in machine speed hits all alike; the ratio ours/raw is the median over rounds of the
ratio paired within a round, and so is the 2-rank vs 1-rank throughput. Process start-up is not part of a
step and is not measured.

    .venv/bin/python benchmarks/ddp.py            # full run (about 5 minutes on 2 idle cores; 10 on busy ones)
    .venv/bin/python benchmarks/ddp.py --quick    # smoke run (< 60 s; process start-up dominates)

Beside the median wall time, the results give rank 0's main-thread CPU time per step (and the JSON file the
10th percentile of the step intervals): on a machine shared with other work, wall time swings with their load,
and these swing less. The target's note says "inconclusive" when the rounds disagree by more than its margin.

Spawn pickles what it sends to the ranks and re-imports this file in each of them: the classes below are
at module level and the entry point sits under `if __name__ == "__main__":`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import (
    StepClock,
    figure,
    lightning_version,
    load_average,
    machine_info,
    paired,
    quartiles,
    steady_intervals,
    write_result,
)
from tables import figures_table
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from callbacks import Callback
from strategies.comm.distributed import find_free_port
from trainer import Trainer, TrainModule

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "ddp.json"
TARGET = 1.03  # ours / raw step time on 2 ranks; reported against, never asserted
WORLD_SIZE = 2

LABELS: dict[str, str] = {
    "raw": "raw DDP script, 2 ranks",
    "ours": "ours, ddp_spawn, 2 ranks",
    "ours_1": "ours, 1 rank",
    "lightning": "Lightning, ddp_spawn, 2 ranks",
}
RANKS: dict[str, int] = {"raw": WORLD_SIZE, "ours": WORLD_SIZE, "ours_1": 1, "lightning": WORLD_SIZE}


@dataclass
class Config:
    """What one benchmark invocation runs."""

    samples: int = 12_800  # 100 steps per epoch on 2 ranks, 200 on 1
    batch_size: int = 64  # per rank
    epochs: int = 2
    rounds: int = 9
    warmup_steps: int = 20
    in_features: int = 256
    hidden: int = 1024
    classes: int = 10
    seed: int = 0
    lr: float = 0.01


# --- workload (identical for every variant) --------------------------------------------------------------
def make_data(cfg: Config) -> TensorDataset:
    """Seeded synthetic classification data: labels are a fixed function of the inputs, so loss goes down."""
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.samples, cfg.in_features, generator=gen)
    w = torch.randn(cfg.in_features, cfg.classes, generator=gen)
    y = (x @ w).argmax(dim=1)
    return TensorDataset(x, y)


def make_mlp(cfg: Config) -> nn.Sequential:
    """in-1024-1024-classes MLP, identically initialised for every variant."""
    torch.manual_seed(cfg.seed)
    return nn.Sequential(
        nn.Linear(cfg.in_features, cfg.hidden), nn.ReLU(),
        nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
        nn.Linear(cfg.hidden, cfg.classes),
    )


def steps_per_fit(cfg: Config, world_size: int) -> int:
    """DistributedSampler pads to a multiple of the world size; drop_last is off."""
    per_rank = -(-cfg.samples // world_size)
    return cfg.epochs * -(-per_rank // cfg.batch_size)



def raw_worker(rank: int, world_size: int, port: int, cfg: Config, out_file: str) -> None:
    """One rank of the hand-written DDP script; rank 0 writes its step stamps to `out_file`."""
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    clock = raw_loop(rank, world_size, cfg, StepClock())
    if rank == 0:
        Path(out_file).write_text(json.dumps({"wall": clock.wall, "cpu": clock.cpu,
                                              "threads": torch.get_num_threads()}))
    dist.destroy_process_group()


def raw_loop(rank: int, world_size: int, cfg: Config, clock: StepClock) -> StepClock:
    """The tutorial's training loop, in a process group already joined; `clock` ticks after every step."""
    dataset = make_data(cfg)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler)
    model = DistributedDataParallel(make_mlp(cfg))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    model.train()
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            clock.tick()
    return clock


def run_raw(cfg: Config) -> dict[str, Any]:
    """The raw script's stamps. A rank that aborts at interpreter exit after writing them (torch's gloo exit race,
    docs/reliability.md: `terminate called without an active exception`, SIGABRT) has run what is measured, as
    launch.py also counts it; any other failure, or one before the stamps exist, ends the benchmark."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "stamps.json")
        try:
            mp.spawn(raw_worker, args=(WORLD_SIZE, find_free_port(), cfg, out_file), nprocs=WORLD_SIZE, join=True)
        except mp.ProcessExitedException as ended:
            if ended.signal_name != "SIGABRT" or not Path(out_file).is_file():
                raise
            print(f"note: the raw script's rank {ended.error_index} aborted at exit after its last step "
                  "(the gloo exit race); its timings stand", flush=True)
        return json.loads(Path(out_file).read_text())


# --- ours --------------------------------------------------------------------------------------------------
class BenchModule(TrainModule):
    """The same MLP, data and loss as a TrainModule; knows nothing about ranks."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.net = make_mlp(cfg)

    def setup(self, stage: str) -> None:
        torch.set_num_threads(1)  # in every rank, before its first step

    def train_dataloader(self) -> DataLoader:
        # A plain shuffled loader: under DDP the Trainer swaps in a DistributedSampler (shuffle kept).
        return DataLoader(make_data(self.cfg), batch_size=self.cfg.batch_size, shuffle=True)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.cfg.lr)


class StepTimer(Callback):
    """Stamps the end of every training batch on global rank 0. Its state is the stamps, so ddp_spawn
    brings them back to this process with the rest of rank 0's callback states."""

    def __init__(self) -> None:
        self.clock = StepClock()
        self.threads = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.is_global_zero:
            self.clock.tick()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.threads = torch.get_num_threads()

    def state_dict(self) -> dict[str, Any]:
        return {"wall": list(self.clock.wall), "cpu": list(self.clock.cpu), "threads": self.threads}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.clock.wall, self.clock.cpu = list(state_dict["wall"]), list(state_dict["cpu"])
        self.threads = state_dict["threads"]


TRAINER_FLAGS: dict[str, Any] = dict(
    accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False, num_sanity_val_steps=0,
)


def run_ours(cfg: Config, devices: int) -> dict[str, Any]:
    timer = StepTimer()
    strategy = "ddp_spawn" if devices > 1 else "auto"
    trainer = Trainer(devices=devices, strategy=strategy, max_epochs=cfg.epochs, callbacks=[timer], **TRAINER_FLAGS)
    trainer.fit(BenchModule(cfg))
    return timer.state_dict()


# --- measurement -------------------------------------------------------------------------------------------
def run_variant(name: str, cfg: Config) -> dict[str, Any]:
    if name == "raw":
        return run_raw(cfg)
    if name == "lightning":
        from _ddp_lightning import run_lightning  # imported only here: Lightning's import takes seconds

        return run_lightning(cfg, BenchModule, TRAINER_FLAGS, WORLD_SIZE)
    return run_ours(cfg, RANKS[name])


@dataclass
class VariantResult:
    name: str
    label: str
    ranks: int
    median_ms: float
    p10_ms: float
    cpu_median_ms: float
    samples_per_s: float
    step_ratio: float | None
    step_ratio_iqr: tuple[float, float] | None
    cpu_step_ratio: float | None
    p10_ratio: float | None
    round_median_ms: list[float] = field(default_factory=list)
    round_cpu_median_ms: list[float] = field(default_factory=list)
    round_step_ratios: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    load_1min_at_start: list[float | None] = field(default_factory=list)


def p10(values: list[float]) -> float:
    """10th percentile: the least-disturbed steps, a floor that load from other processes inflates least."""
    return statistics.quantiles(values, n=10)[0]



def measure(cfg: Config, names: list[str], verbose: bool = True) -> dict[str, list[dict[str, Any]]]:
    """`cfg.rounds` rounds; round r starts at variant r (rotated order)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rnd in range(cfg.rounds):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            load = load_average()
            run = run_variant(name, cfg)
            run["load_1min_at_start"] = load[0] if load else None
            expected = steps_per_fit(cfg, RANKS[name])
            if len(run["wall"]) != expected:
                raise RuntimeError(f"{name}: {len(run['wall'])} steps recorded on rank 0, expected {expected}")
            runs[name].append(run)
            if verbose:
                med = statistics.median(steady_intervals(run["wall"], cfg.warmup_steps)) * 1e3
                print(f"round {rnd + 1}/{cfg.rounds} {name:7s} {med:7.2f} ms/step  "
                      f"(fit + launch {time.perf_counter() - started:5.1f} s)", flush=True)
    return runs


def summarize(cfg: Config, runs: dict[str, list[dict[str, Any]]]) -> list[VariantResult]:
    w = cfg.warmup_steps
    per_round = {n: [statistics.median(steady_intervals(r["wall"], w)) for r in rs] for n, rs in runs.items()}
    per_round_cpu = {n: [statistics.median(steady_intervals(r["cpu"], w)) for r in rs] for n, rs in runs.items()}
    per_round_p10 = {n: [p10(steady_intervals(r["wall"], w)) for r in rs] for n, rs in runs.items()}
    out = []
    for name, variant_runs in runs.items():
        ranks = RANKS[name]
        pooled = [d for r in variant_runs for d in steady_intervals(r["wall"], w)]
        pooled_cpu = [d for r in variant_runs for d in steady_intervals(r["cpu"], w)]
        ratios = cpu_ratios = p10_ratios = None
        if name != "raw" and ranks == WORLD_SIZE:
            p10_ratios = paired(per_round_p10[name], per_round_p10["raw"])
            ratios = paired(per_round[name], per_round["raw"])
            cpu_ratios = paired(per_round_cpu[name], per_round_cpu["raw"])
        median_s = statistics.median(pooled)
        out.append(VariantResult(
            name=name, label=LABELS[name], ranks=ranks,
            median_ms=round(median_s * 1e3, 3),
            p10_ms=round(p10(pooled) * 1e3, 3),
            cpu_median_ms=round(statistics.median(pooled_cpu) * 1e3, 3),
            samples_per_s=round(cfg.batch_size * ranks / median_s, 1),
            step_ratio=round(statistics.median(ratios), 4) if ratios else None,
            step_ratio_iqr=quartiles(ratios) if ratios else None,
            cpu_step_ratio=round(statistics.median(cpu_ratios), 4) if cpu_ratios else None,
            p10_ratio=round(statistics.median(p10_ratios), 4) if p10_ratios else None,
            round_median_ms=[round(m * 1e3, 3) for m in per_round[name]],
            round_cpu_median_ms=[round(m * 1e3, 3) for m in per_round_cpu[name]],
            round_step_ratios=[round(x, 4) for x in ratios] if ratios else [],
            threads=[r["threads"] for r in variant_runs],
            load_1min_at_start=[r["load_1min_at_start"] for r in variant_runs],
        ))
    return out


def spread_note(ratios: list[float]) -> str | None:
    """Says so when the rounds disagree by more than the target's margin (noise from other load)."""
    lo, hi = quartiles(ratios)
    return f"inconclusive: rounds' IQR {lo:.2f}–{hi:.2f}" if hi - lo > 2 * (TARGET - 1.0) else None


def figures(cfg: Config, results: list[VariantResult]) -> list[dict[str, Any]]:
    """Wall and rank-0 CPU ms/step (each round's median) against raw DDP; 2-rank vs 1-rank throughput."""
    by = {r.name: r for r in results}
    out = []
    for r in results:
        role = "baseline" if r.name == "raw" else "lightning" if r.name == "lightning" else "ours"
        compared = r.name != "raw" and r.ranks == WORLD_SIZE
        out.append(figure(r.name, r.label, r.round_median_ms, "ms/step", role=role,
                          baseline="raw" if compared else None, ratios=r.round_step_ratios if compared else None,
                          target=TARGET if r.name == "ours" else None,
                          note=spread_note(r.round_step_ratios) if r.name == "ours" else None))
    for name in [n for n in ("raw", "ours", "lightning") if n in by]:
        r = by[name]
        out.append(figure(
            f"{name}_cpu", f"{r.label}: rank-0 CPU time", r.round_cpu_median_ms, "ms/step",
            role="baseline" if name == "raw" else "lightning" if name == "lightning" else "ours",
            baseline=None if name == "raw" else "raw_cpu",
            ratios=None if name == "raw" else paired(r.round_cpu_median_ms, by["raw"].round_cpu_median_ms),
        ))
    if "ours" in by and "ours_1" in by:
        one = [cfg.batch_size / (m / 1e3) for m in by["ours_1"].round_median_ms]
        two = [cfg.batch_size * WORLD_SIZE / (m / 1e3) for m in by["ours"].round_median_ms]
        speedup = statistics.median(paired(two, one))
        out.append(figure("ours_1_throughput", "ours, 1 rank: throughput", one, "samples/s", role="baseline",
                          better="higher"))
        out.append(figure("ours_throughput", "ours, 2 ranks: throughput", two, "samples/s", better="higher",
                          baseline="ours_1_throughput", ratios=paired(two, one),
                          note=f"scaling efficiency {speedup / WORLD_SIZE:.0%}"))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of one 20-step epoch (smoke test, < 60 s)")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 9, quick 2)")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every rank started below, read at their torch import
    torch.set_num_threads(1)  # the 1-rank variant runs in this process
    cfg = Config()
    if args.quick:
        cfg.rounds, cfg.samples, cfg.epochs, cfg.warmup_steps = 2, 2_560, 1, 5
    cfg.rounds = args.rounds if args.rounds is not None else cfg.rounds
    names = ["raw", "ours", "ours_1"]
    if not args.no_lightning and lightning_version() is not None:
        os.environ.setdefault("PYTHONWARNINGS", "ignore")  # Lightning's num_workers hints, in every rank
        names.append("lightning")
    n_params = sum(p.numel() for p in make_mlp(cfg).parameters())
    print(f"MLP {cfg.in_features}-{cfg.hidden}-{cfg.hidden}-{cfg.classes} ({n_params / 1e6:.2f} M parameters), "
          f"batch {cfg.batch_size} per rank, {steps_per_fit(cfg, WORLD_SIZE)} steps per 2-rank fit, "
          f"{cfg.rounds} rounds, gloo, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
    load_before = load_average()
    started = time.perf_counter()
    runs = measure(cfg, names)
    elapsed = time.perf_counter() - started
    results = summarize(cfg, runs)
    figs = figures(cfg, results)
    table = figures_table(figs)
    print(f"\nfirst {cfg.warmup_steps} step intervals of each fit dropped, torch {torch.__version__}, "
          f"1 thread per rank, load average before/after {load_before} / {load_average()}\n")
    print(table)
    print(f"\nbenchmark took {elapsed:.1f} s")

    write_result(
        args.out, "ddp", figs, mode="quick" if args.quick else "full", config=asdict(cfg),
        elapsed_s=elapsed, machine=machine_info(omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                                                lightning=lightning_version()),
        parameters=n_params, load_average_before_after=[load_before, load_average()], target=TARGET,
        results=[asdict(r) for r in results], table=table,
    )


if __name__ == "__main__":
    main()
