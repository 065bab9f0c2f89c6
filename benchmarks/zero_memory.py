"""ZeRO memory per rank: parameters, gradients and optimizer state under ddp, zero1, zero2 and zero3.

Every stage trains the same MLP (``depth`` x Linear(width, width) + ReLU, then Linear(width, 10); about
51.4 M parameters in the full run) with AdamW on seeded synthetic data, batch 32 per rank, through our
Trainer: ``Trainer(strategy=<stage>, accelerator="cpu", devices=2, ...)`` on 2 CPU ranks joined by gloo on
127.0.0.1. The ranks are forked (the pattern of tests/helpers/dist.py): each child sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT so the Trainer joins that world instead of launching one, and calls
``torch.set_num_threads(1)`` before any torch op.

What is measured, per rank, by a Callback (no allocator hooks: tensor bytes are read directly):

- params: bytes of the parameters as registered on the module after the optimizer step ("at rest"); a
  DTensor (FSDP2) counts its local shard (``to_local()``);
- params after forward: the same, read in ``on_before_backward`` of the last step. FSDP2 swaps the
  unsharded parameters in during forward; zero2 (``reshard_after_forward=False``) keeps them until backward,
  zero3 frees them after each unit's forward;
- grads: bytes of ``p.grad`` (local shards for DTensors) in ``on_before_optimizer_step``, i.e. after the
  gradients were all-reduced (ddp, zero1) or reduce-scattered (zero2, zero3). DDP's own flat gradient buckets
  (``gradient_as_bucket_view=False``, the default) are extra and not counted here: see peak RSS;
- optimizer state: tensors in ``optimizer.state`` after the step; for ZeroRedundancyOptimizer (zero1) the
  local optimizer ``opt.optim``, which only holds this rank's partition;
- peak RSS: the kernel's high-water mark (VmHWM, reset through /proc/self/clear_refs at train start, so it
  covers the training steps only) minus the RSS before the model was built (the process with torch and the
  data), the highest over rounds. Includes activations, DDP's buckets, communication buffers, about
  130 MiB of per-process set-up (process group, Trainer) and allocator slack: a rough figure.

Bytes are counted per storage (a view into a flat buffer counts the buffer once). Tables show the larger of
the two ranks (ZeRO-1 partitions whole tensors, so its ranks can differ); the JSON has both ranks.

Step time: rank 0 stamps the end of each batch; the first ``warmup`` intervals are dropped and the median
of the rest is taken. It is split (medians) into forward + backward, with the gradient all-reduce or
reduce-scatter (batch start to ``on_before_optimizer_step``), and the optimizer part (from there to the
batch end: the step, zero1's parameter broadcast, ``zero_grad``). Stages run in ``rounds`` rounds with a
rotated order, each fit in fresh forked processes; the ratio to ddp is the median over rounds of the ratio
within a round. The development machine has 2 cores shared with other work: step times are noisy; the
memory figures are not.

    .venv/bin/python benchmarks/zero_memory.py            # full run (51.4 M parameters, 3 rounds; about 4-8 minutes)
    .venv/bin/python benchmarks/zero_memory.py --quick    # smoke run (4.2 M parameters; < 90 s)

Then the "largest model" figure (benchmarks/zero_largest.py): peak RSS per rank from process start through the
first optimizer step, for ddp, zero1, zero2, zero3 and zero3 with meta-device initialisation (zero3_meta).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import zero_largest
from common import figure, machine_info, paired, write_result
from forked_ranks import run_forked
from torch import Tensor, nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Trainer, TrainModule

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "zero_memory.json"
STAGES = ("ddp", "zero1", "zero2", "zero3")
WORLD_SIZE = 2
MiB = 2**20


@dataclass
class Config:
    width: int = 3584
    depth: int = 4
    classes: int = 10
    batch_size: int = 32  # per rank
    steps: int = 10
    warmup: int = 3  # step intervals dropped before the median
    rounds: int = 3
    seed: int = 0
    timeout: float = 600.0  # per fit (both ranks)


QUICK = Config(width=1024, depth=4, steps=8, warmup=3, rounds=1, timeout=120.0)


# --- the workload ----------------------------------------------------------------------------------------
class MLP(TrainModule):
    """Knows nothing about ranks or sharding: the same module runs under every stage."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        torch.manual_seed(cfg.seed)
        layers: list[nn.Module] = []
        for _ in range(cfg.depth):
            layers += [nn.Linear(cfg.width, cfg.width), nn.ReLU()]
        layers.append(nn.Linear(cfg.width, cfg.classes))
        self.net = nn.Sequential(*layers)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4, weight_decay=0.01)


def make_data(cfg: Config) -> TensorDataset:
    gen = torch.Generator().manual_seed(cfg.seed)
    n = cfg.batch_size * WORLD_SIZE * cfg.steps
    x = torch.randn(n, cfg.width, generator=gen)
    y = torch.randint(0, cfg.classes, (n,), generator=gen)
    return TensorDataset(x, y)


def num_params(cfg: Config) -> int:
    return cfg.depth * (cfg.width * cfg.width + cfg.width) + cfg.width * cfg.classes + cfg.classes


# --- measuring -------------------------------------------------------------------------------------------
def tensor_bytes(tensors: Any) -> int:
    """Bytes of the storages behind `tensors` (local shards for DTensors), each storage counted once."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return [v for state in local.state.values() for v in state.values() if isinstance(v, Tensor)]


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


class Probe(Callback):
    """Reads this rank's tensor bytes at the points described in the module docstring; stamps steps."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.fwd_bwd_s: list[float] = []  # batch start -> before the optimizer step (incl. gradient sync)
        self.opt_s: list[float] = []  # before the optimizer step -> batch end (clip, step, zero_grad)
        self._batch_start = self._before_step = 0.0
        self.params = self.params_after_forward = self.grads = self.optimizer_state = 0
        self.rss_train_start_kib = 0
        self.peak_reset = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.rss_train_start_kib = _proc_status_kib("VmRSS")
        self.peak_reset = _reset_peak_rss()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch_start = time.perf_counter()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Tensor) -> None:
        self.params_after_forward = tensor_bytes(pl_module.parameters())

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.grads = tensor_bytes(p.grad for p in pl_module.parameters())
        self._before_step = time.perf_counter()
        self.fwd_bwd_s.append(self._before_step - self._batch_start)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.stamps.append(time.perf_counter())
        self.opt_s.append(self.stamps[-1] - self._before_step)
        self.params = tensor_bytes(pl_module.parameters())
        self.optimizer_state = tensor_bytes(optimizer_state_tensors(trainer.optimizers[0]))


def run_rank(rank: int, stage: str, cfg: Config) -> dict[str, Any]:
    data = make_data(cfg)
    rss_baseline_kib = _proc_status_kib("VmRSS")
    model = MLP(cfg)
    probe = Probe()
    trainer = Trainer(strategy=stage, accelerator="cpu", devices=WORLD_SIZE, max_steps=cfg.steps,
                      callbacks=[probe], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(data, batch_size=cfg.batch_size))
    peak_kib = _proc_status_kib("VmHWM")
    intervals = [b - a for a, b in zip(probe.stamps, probe.stamps[1:], strict=False)][cfg.warmup:]
    return {
        "rank": rank,
        "strategy": repr(trainer.strategy),
        "optimizer": type(trainer.optimizers[0]).__name__,
        "steps": len(probe.stamps),
        "params_bytes": probe.params,
        "params_after_forward_bytes": probe.params_after_forward,
        "grads_bytes": probe.grads,
        "optimizer_state_bytes": probe.optimizer_state,
        "model_state_bytes": probe.params + probe.grads + probe.optimizer_state,
        "rss_baseline_bytes": rss_baseline_kib * 1024,
        "rss_train_start_bytes": probe.rss_train_start_kib * 1024,
        "peak_rss_bytes": peak_kib * 1024,
        "peak_rss_above_baseline_bytes": (peak_kib - rss_baseline_kib) * 1024,
        "peak_reset_at_train_start": probe.peak_reset,
        "step_intervals_s": intervals,
        "step_s": statistics.median(intervals) if intervals else float("nan"),
        "fwd_bwd_s": statistics.median(probe.fwd_bwd_s[cfg.warmup + 1:]),
        "opt_s": statistics.median(probe.opt_s[cfg.warmup + 1:]),
    }


# --- forked ranks (as in tests/helpers/dist.py) ------------------------------------------------------------
def run_stage(stage: str, cfg: Config) -> list[dict[str, Any]]:
    """One fit of `stage` on WORLD_SIZE freshly forked ranks; each rank's measurements, by rank."""
    return run_forked(lambda rank: run_rank(rank, stage, cfg), stage, WORLD_SIZE, cfg.timeout)


# --- summary ---------------------------------------------------------------------------------------------
def expected_bytes(stage: str, p: int, n: int) -> dict[str, float]:
    """The formula of docs/zero.md for fp32 + Adam(W): 4P params, 4P grads, 8P optimizer state."""
    full: dict[str, float] = {"params": 4 * p, "grads": 4 * p, "optimizer_state": 8 * p}
    if stage == "ddp":
        return full
    if stage == "zero1":
        return {**full, "optimizer_state": 8 * p / n}
    return {k: v / n for k, v in full.items()}  # FSDP2 keeps zero2's parameters sharded at rest, too


def summarize(runs: dict[str, list[list[dict[str, Any]]]], cfg: Config) -> dict[str, Any]:
    p = num_params(cfg)
    keys = ("params_bytes", "params_after_forward_bytes", "grads_bytes", "optimizer_state_bytes",
            "model_state_bytes", "peak_rss_above_baseline_bytes")
    summary: dict[str, Any] = {}
    for stage in STAGES:
        last = runs[stage][-1]  # tensor bytes are identical across rounds
        row: dict[str, Any] = {k: max(r[k] for r in last) for k in keys}
        row["per_rank"] = {k: [r[k] for r in last] for k in keys}
        peak = "peak_rss_above_baseline_bytes"  # a peak: the highest over rounds (it varies by ~100 MiB)
        row[peak] = max(r[peak] for rnd in runs[stage] for r in rnd)
        row["per_rank"][peak] = [max(rnd[rank][peak] for rnd in runs[stage]) for rank in range(WORLD_SIZE)]
        row["step_s_per_round"] = [rnd[0]["step_s"] for rnd in runs[stage]]
        row["step_s"] = statistics.median(row["step_s_per_round"])
        row["fwd_bwd_s"] = statistics.median(rnd[0]["fwd_bwd_s"] for rnd in runs[stage])
        row["opt_s"] = statistics.median(rnd[0]["opt_s"] for rnd in runs[stage])
        row["optimizer"] = last[0]["optimizer"]
        exp = expected_bytes(stage, p, WORLD_SIZE)
        row["expected_bytes"] = {**exp, "model_state": sum(exp.values())}
        summary[stage] = row
    ddp = summary["ddp"]
    for stage in STAGES:
        row = summary[stage]
        row["optimizer_state_vs_ddp"] = row["optimizer_state_bytes"] / ddp["optimizer_state_bytes"]
        row["model_state_vs_ddp"] = row["model_state_bytes"] / ddp["model_state_bytes"]
        ratios = [s / d for s, d in zip(row["step_s_per_round"], ddp["step_s_per_round"], strict=True)]
        row["step_time_vs_ddp_per_round"] = ratios
        row["step_time_vs_ddp"] = statistics.median(ratios)
    return summary


def markdown_table(summary: dict[str, Any]) -> str:
    head = ("| strategy | params MiB | params after fwd MiB | grads MiB | optimizer state MiB | model state MiB "
            "| model state vs ddp (formula) | optimizer state vs ddp | peak RSS above baseline MiB "
            "| step ms | fwd+bwd / optimizer ms | step time vs ddp |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    ddp_expected = summary["ddp"]["expected_bytes"]["model_state"]
    for stage, row in summary.items():
        formula = row["expected_bytes"]["model_state"] / ddp_expected
        lines.append(
            f"| {stage} | {row['params_bytes'] / MiB:.1f} | {row['params_after_forward_bytes'] / MiB:.1f} "
            f"| {row['grads_bytes'] / MiB:.1f} | {row['optimizer_state_bytes'] / MiB:.1f} "
            f"| {row['model_state_bytes'] / MiB:.1f} | {row['model_state_vs_ddp']:.3f} ({formula:.3f}) "
            f"| {row['optimizer_state_vs_ddp']:.3f} | {row['peak_rss_above_baseline_bytes'] / MiB:.0f} "
            f"| {row['step_s'] * 1e3:.0f} | {row['fwd_bwd_s'] * 1e3:.0f} / {row['opt_s'] * 1e3:.0f} "
            f"| {row['step_time_vs_ddp']:.2f}x |"
        )
    return "\n".join(lines)


def figures(runs: dict[str, list[list[dict[str, Any]]]], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per stage: model state and peak RSS (MiB, the larger rank) and step time, each paired per round with ddp."""
    ddp_formula = summary["ddp"]["expected_bytes"]["model_state"]
    out = []
    for key, label, unit, scale in (("model_state_bytes", "model state per rank", "MiB", 1 / MiB),
                                    ("peak_rss_above_baseline_bytes", "peak RSS above baseline", "MiB", 1 / MiB),
                                    ("step_s", "step time (rank 0)", "ms/step", 1e3)):
        short = key.removesuffix("_bytes").removesuffix("_s")  # model_state, peak_rss_above_baseline, step
        base = [(rnd[0][key] if key == "step_s" else max(r[key] for r in rnd)) * scale for rnd in runs["ddp"]]
        for stage in STAGES:
            values = [(rnd[0][key] if key == "step_s" else max(r[key] for r in rnd)) * scale for rnd in runs[stage]]
            formula = summary[stage]["expected_bytes"]["model_state"] / ddp_formula
            is_base = stage == "ddp"
            out.append(figure(
                f"{stage}_{short}", f"{stage}: {label}", values, unit, role="baseline" if is_base else "ours",
                baseline=None if is_base else f"ddp_{short}", ratios=None if is_base else paired(values, base),
                note=f"formula {formula:.3f}x" if key == "model_state_bytes" and not is_base else None,
            ))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4.2 M parameters, one round (< 90 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default: {DEFAULT_OUT})")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    args = parser.parse_args()
    cfg = QUICK if args.quick else Config()
    if args.rounds is not None:
        cfg.rounds = args.rounds
    torch.set_num_threads(1)
    started = time.perf_counter()
    print(f"{num_params(cfg) / 1e6:.1f} M parameters, AdamW, {WORLD_SIZE} CPU ranks (gloo), batch "
          f"{cfg.batch_size}/rank, {cfg.steps} steps per fit, {cfg.rounds} round(s); load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    runs: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in STAGES}
    for rnd in range(cfg.rounds):
        order = STAGES[rnd % len(STAGES):] + STAGES[:rnd % len(STAGES)]
        for stage in order:
            t0 = time.perf_counter()
            result = run_stage(stage, cfg)
            runs[stage].append(result)
            print(f"  round {rnd + 1} {stage}: {result[0]['step_s'] * 1e3:.0f} ms/step (fwd+bwd "
                  f"{result[0]['fwd_bwd_s'] * 1e3:.0f}, optimizer {result[0]['opt_s'] * 1e3:.0f}), "
                  f"fit {time.perf_counter() - t0:.1f} s", flush=True)
    summary = summarize(runs, cfg)
    table = markdown_table(summary)
    print()
    print(table)
    largest_cfg = zero_largest.QUICK_LARGEST if args.quick else zero_largest.LargestConfig()
    print(f"\nLargest model: {largest_cfg.depth} x Linear({largest_cfg.width}, {largest_cfg.width}), AdamW, one step")
    largest = zero_largest.measure(largest_cfg)
    largest_table = zero_largest.markdown_table(largest)
    print(largest_table)
    elapsed = time.perf_counter() - started
    write_result(args.out, "zero_memory", figures(runs, summary) + zero_largest.figures(largest, figure),
                 mode="quick" if args.quick else "full", config=asdict(cfg), elapsed_s=elapsed, machine=machine_info(),
                 num_params=num_params(cfg), world_size=WORLD_SIZE, summary=summary, runs=runs, table_markdown=table,
                 largest_model={**largest, "config": asdict(largest_cfg), "table_markdown": largest_table})
    print(f"({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
