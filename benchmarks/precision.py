"""Step time per precision through our Trainer: 32-true vs bf16-mixed vs bf16-true on a compute-bound model.

The default workload is 4 x Linear(1024) (with ReLUs) on a batch of 64, so matrix multiplies dominate the step
and the precision's effect on them is what gets measured, not the framework's bookkeeping. On a CPU without
native bf16 matmul (AVX2 only), bf16 is expected to be much *slower* than fp32: torch emulates it. Speed-ups
need hardware with bf16 units (a GPU with tensor cores, or a CPU with AVX512-BF16/AMX); `--model transformer
--accelerator cuda` is the GPU workload (one TransformerEncoderLayer, d_model 1024, 16 x 512 tokens).

Per-step time: a callback stamps `time.perf_counter()` at every `on_train_batch_end` (after the optimizer
step; on CUDA after a synchronize). We drop the first `--warmup` intervals of each fit and report the median
over all rounds; the ratio to 32-true is the median of per-round paired ratios. Variants run interleaved in
rounds with a rotated order so drift in machine speed hits them alike. One torch thread by default: on a
busy 2-core machine, two OpenMP threads wait on each other and fp32 time swings by 2x or more.

    .venv/bin/python benchmarks/precision.py            # full run (a few minutes on 2 CPU cores)
    .venv/bin/python benchmarks/precision.py --quick    # smoke run (< 60 s)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from common import figure, machine_info, paired, write_result
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Trainer, TrainModule

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "precision.json"
DEFAULT_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")


@dataclass
class Config:
    """What one benchmark invocation runs."""

    model: str = "mlp"
    accelerator: str = "cpu"
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS
    width: int = 1024
    batch_size: int = 64
    seq_len: int = 512  # transformer only
    steps: int = 20  # measured steps per fit
    warmup: int = 3  # dropped steps per fit
    rounds: int = 3
    seed: int = 0


def make_net(cfg: Config) -> nn.Module:
    """The workload, identically initialised for every variant."""
    torch.manual_seed(cfg.seed)
    if cfg.model == "transformer":
        return nn.TransformerEncoderLayer(cfg.width, nhead=16, dim_feedforward=4 * cfg.width, batch_first=True)
    layers: list[nn.Module] = []
    for i in range(4):
        layers += [nn.Linear(cfg.width, cfg.width)] + ([nn.ReLU()] if i < 3 else [])
    return nn.Sequential(*layers)


class Workload(TrainModule):
    """The net plus one fixed batch held as buffers: they move and cast with the module like inputs would,
    and no host-side collation or copy (64 MB per step for the transformer) pollutes a GPU measurement."""

    x: Tensor
    y: Tensor

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.net = make_net(cfg)
        gen = torch.Generator().manual_seed(cfg.seed)
        shape = (cfg.batch_size, cfg.seq_len, cfg.width) if cfg.model == "transformer" else (cfg.batch_size, cfg.width)
        self.register_buffer("x", torch.randn(*shape, generator=gen))
        self.register_buffer("y", torch.randn(*shape, generator=gen))

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return F.mse_loss(self.net(self.x).float(), self.y.float())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class StepTimer(Callback):
    """Stamps the end of every training batch; synchronizes first on CUDA so the stamp means 'done'."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.stamps: list[float] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())


def run_once(cfg: Config, precision: str) -> list[float]:
    """One fit; returns the steady-state step intervals in seconds."""
    timer = StepTimer(cuda=cfg.accelerator == "cuda")
    trainer = Trainer(
        accelerator=cfg.accelerator, devices=1, precision=precision, max_epochs=1, callbacks=[timer], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(Workload(cfg), DataLoader(TensorDataset(torch.arange(cfg.steps + cfg.warmup + 1))))
    deltas = [b - a for a, b in zip(timer.stamps, timer.stamps[1:], strict=False)]
    return deltas[cfg.warmup:]


def measure(cfg: Config) -> dict[str, list[list[float]]]:
    """`cfg.rounds` rounds; round r starts at variant r so no precision always runs first."""
    names = list(cfg.precisions)
    runs: dict[str, list[list[float]]] = {name: [] for name in names}
    for rnd in range(cfg.rounds):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            runs[name].append(run_once(cfg, name))
    return runs


def summarize(runs: dict[str, list[list[float]]]) -> list[dict[str, Any]]:
    """Median µs/step per precision, and its median per-round ratio to the first precision (32-true)."""
    base_name = next(iter(runs))
    base = [statistics.median(r) for r in runs[base_name]]
    out = []
    for name, rounds in runs.items():
        per_round = [statistics.median(r) for r in rounds]
        out.append({
            "precision": name,
            "median_us": statistics.median(d for r in rounds for d in r) * 1e6,
            "round_median_us": [round(m * 1e6, 1) for m in per_round],
            "round_ratios": paired(per_round, base),
            "ratio": statistics.median(paired(per_round, base)),
            "baseline": base_name,
        })
    return out


def figures(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ms/step per precision (each round's median), paired per round against the first precision."""
    return [figure(r["precision"], f"Trainer(precision=\"{r['precision']}\")",
                   [m / 1e3 for m in r["round_median_us"]], "ms/step",
                   role="baseline" if i == 0 else "ours", baseline=None if i == 0 else results[0]["precision"],
                   ratios=None if i == 0 else r["round_ratios"])
            for i, r in enumerate(results)]


def markdown_table(results: list[dict[str, Any]]) -> str:
    lines = ["| precision | median µs/step | vs 32-true (time) |", "|---|---:|---:|"]
    for r in results:
        lines.append(f"| {r['precision']} | {r['median_us']:.0f} | {r['ratio']:.2f}x |")
    return "\n".join(lines)


def precision_machine_info(cfg: Config) -> dict[str, Any]:
    """Enough to tell whether two result files are comparable (the CPU's vector ISA decides bf16 speed)."""
    gpu = {"gpu": torch.cuda.get_device_name(0)} if cfg.accelerator == "cuda" else {}
    return machine_info(cpu_capability=torch.backends.cpu.get_cpu_capability(), **gpu)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 6 steps (smoke test, < 60 s on CPU)")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 3, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per fit (default 20, quick 6)")
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--width", type=int, default=1024, help="features per layer / d_model (default 1024)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 64 (mlp), 16 (transformer)")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precisions", nargs="+", default=list(DEFAULT_PRECISIONS),
                        help="first one is the baseline (default: 32-true bf16-mixed bf16-true)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier on a shared machine; 0 = torch's own choice)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = Config(model=args.model, accelerator=args.accelerator, precisions=tuple(args.precisions), width=args.width)
    cfg.batch_size = args.batch_size or (16 if cfg.model == "transformer" else 64)
    if args.quick:
        cfg.rounds, cfg.steps, cfg.warmup = 1, 6, 2
    cfg.rounds = args.rounds if args.rounds is not None else cfg.rounds
    cfg.steps = args.steps if args.steps is not None else cfg.steps

    started = time.perf_counter()
    results = summarize(measure(cfg))
    elapsed = time.perf_counter() - started
    table = markdown_table(results)
    print(f"\n{cfg.model} (width {cfg.width}, batch {cfg.batch_size}) on {cfg.accelerator}, {cfg.steps} steps x "
          f"{cfg.rounds} round(s), first {cfg.warmup} dropped, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}\n")
    print(table)
    print(f"\nbenchmark took {elapsed:.1f} s")

    write_result(args.out, "precision", figures(results), mode="quick" if args.quick else "full",
                 config=asdict(cfg), elapsed_s=elapsed, machine=precision_machine_info(cfg), results=results,
                 table=table)


if __name__ == "__main__":
    main()
