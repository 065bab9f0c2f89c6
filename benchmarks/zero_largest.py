"""The "largest model" figure of benchmarks/zero_memory.py: peak resident memory per rank, from process start
through the first optimizer step, for ddp, zero1, zero2, zero3 and zero3 with meta-device initialisation.

What decides whether a job starts is its highest moment, and before sharding every strategy but "zero3_meta" builds
the whole model on every rank. Each stage trains the same MLP (``depth`` x Linear(width, width), several hundred
MiB of fp32 parameters) with AdamW for one step on 2 forked CPU ranks (gloo), through our Trainer. The model is
built in the rank's process, after its start: plainly for ddp/zero1/zero2/zero3, inside ``trainer.init_module()``
under zero3 for "zero3_meta" (layers on the meta device, materialised shard by shard after ``fully_shard``).

Peak: the kernel's high-water mark (VmHWM) reset through /proc/self/clear_refs as the rank starts, read after the
first optimizer step, minus the RSS at the rank's start. The libraries (torch, the Trainer, FSDP2's lazily imported
modules) are imported before the ranks fork, so they count for no stage. Each rank fixes glibc's mmap threshold
(mallopt M_MMAP_THRESHOLD = 1 MiB): with glibc's adaptive threshold, freed multi-MiB buffers (all-gathers,
temporaries) stay in the heap and RSS follows the allocator's history rather than the live tensors.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # noqa: F401  (fully_shard imports it on first use, ~140 MiB: imported before the fork)
from forked_ranks import run_forked
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies.model.dtensor import torch_sharding
from trainer import Trainer, TrainModule

STAGES = ("ddp", "zero1", "zero2", "zero3", "zero3_meta")
WORLD_SIZE = 2
MiB = 2**20
TARGET = 0.6  # zero3_meta's peak vs ddp's


@dataclass
class LargestConfig:
    width: int = 4096
    depth: int = 6  # 6 x 4096 x 4096 fp32: 384 MiB of parameters (100.7 M)
    batch_size: int = 8
    seed: int = 0
    timeout: float = 600.0


QUICK_LARGEST = LargestConfig(width=1024, depth=4, timeout=120.0)


class Wide(TrainModule):
    def __init__(self, cfg: LargestConfig) -> None:
        super().__init__()
        self.net = nn.Sequential(*(nn.Linear(cfg.width, cfg.width, bias=False) for _ in range(cfg.depth)))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return F.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class FirstStepPeak(Callback):
    """Reads the high-water mark once the model is set up (built and sharded: fit start) and once the first
    optimizer step is done."""

    def __init__(self) -> None:
        self.peak_kib = self.setup_peak_kib = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.setup_peak_kib = _status_kib("VmHWM")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.peak_kib:
            self.peak_kib = _status_kib("VmHWM")


def run_rank(rank: int, stage: str, cfg: LargestConfig) -> dict[str, Any]:
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (see the module docstring)
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts at the rank's start
    start_kib = _status_kib("VmRSS")
    probe = FirstStepPeak()
    trainer = Trainer(strategy=stage.removesuffix("_meta"), accelerator="cpu", devices=WORLD_SIZE, max_steps=1,
                      callbacks=[probe], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0)
    torch.manual_seed(cfg.seed)
    if stage.endswith("_meta"):
        with trainer.init_module():
            model = Wide(cfg)
    else:
        model = Wide(cfg)
    x = torch.randn(cfg.batch_size * WORLD_SIZE, cfg.width, generator=torch.Generator().manual_seed(cfg.seed))
    trainer.fit(model, DataLoader(TensorDataset(x, x), batch_size=cfg.batch_size))
    return {"rank": rank, "steps": trainer.global_step, "rss_start_bytes": start_kib * 1024,
            "peak_rss_bytes": probe.peak_kib * 1024, "peak_above_start_bytes": (probe.peak_kib - start_kib) * 1024,
            "setup_peak_above_start_bytes": (probe.setup_peak_kib - start_kib) * 1024}


def run_stage(stage: str, cfg: LargestConfig) -> list[dict[str, Any]]:
    torch_sharding()  # imported before the fork, like torch itself
    return run_forked(lambda rank: run_rank(rank, stage, cfg), stage, WORLD_SIZE, cfg.timeout)


def measure(cfg: LargestConfig) -> dict[str, Any]:
    """Every stage once, in fresh ranks: the larger rank's peak above its start, and the ratio to ddp."""
    param_bytes = cfg.depth * cfg.width * cfg.width * 4
    rows: dict[str, Any] = {}
    for stage in STAGES:
        ranks = run_stage(stage, cfg)
        peak = max(r["peak_above_start_bytes"] for r in ranks)
        setup = max(r["setup_peak_above_start_bytes"] for r in ranks)
        rows[stage] = {"peak_above_start_bytes": peak, "setup_peak_above_start_bytes": setup, "per_rank": ranks,
                       "peak_vs_full_params": peak / param_bytes, "setup_peak_vs_full_params": setup / param_bytes}
        print(f"  largest model, {stage}: peak {peak / MiB:.0f} MiB above start (set-up {setup / MiB:.0f})",
              flush=True)
    for row in rows.values():
        row["peak_vs_ddp"] = row["peak_above_start_bytes"] / rows["ddp"]["peak_above_start_bytes"]
    return {"param_bytes": param_bytes, "num_params": param_bytes // 4, "stages": rows, "target_vs_ddp": TARGET}


def markdown_table(result: dict[str, Any]) -> str:
    lines = ["| strategy | peak RSS through the first step, MiB above start (larger rank) | vs ddp "
             "| set-up peak (built and sharded) MiB | set-up peak vs full fp32 parameters |",
             "|---|---:|---:|---:|---:|"]
    for stage, row in result["stages"].items():
        lines.append(f"| {stage} | {row['peak_above_start_bytes'] / MiB:.0f} | {row['peak_vs_ddp']:.2f}x "
                     f"| {row['setup_peak_above_start_bytes'] / MiB:.0f} | {row['setup_peak_vs_full_params']:.2f}x |")
    return "\n".join(lines)


def figures(result: dict[str, Any], figure: Any) -> list[dict[str, Any]]:
    """The figures for zero_memory's result file (one measurement each)."""
    ddp = result["stages"]["ddp"]["peak_above_start_bytes"] / MiB
    out = []
    for stage, row in result["stages"].items():
        value = row["peak_above_start_bytes"] / MiB
        is_base = stage == "ddp"
        out.append(figure(
            f"largest_{stage}_peak_rss", f"largest model, {stage}: peak RSS per rank through the first step",
            [value], "MiB", role="baseline" if is_base else "ours",
            baseline=None if is_base else "largest_ddp_peak_rss",
            ratios=None if is_base else [value / ddp], target=TARGET if stage == "zero3_meta" else None,
        ))
    return out
