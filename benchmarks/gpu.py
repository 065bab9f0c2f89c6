"""GPU throughput: ResNet-18, a small GPT and a small MLP, 32-true vs bf16-mixed, a raw torch loop vs our
Trainer (and Lightning when installed), on one CUDA device.

Workloads (synthetic data made on the GPU once, so no input pipeline is measured):
- ResNet-18 (torchvision, `weights=None`, 1,000 classes), batch 128 of 3 x 224 x 224 images, SGD with
  momentum, cross-entropy; figures in images/s;
- a GPT-style decoder written here (6 blocks, d_model 512, 8 heads, causal `scaled_dot_product_attention`,
  GELU MLP, vocabulary 16,384), batch 16 x 512 tokens, AdamW, next-token cross-entropy; figures in tokens/s;
- a 4-layer MLP (256 -> 512 -> 512 -> 512 -> 10, ReLU), batch 256, Adam, cross-entropy: so little GPU work per step
  that the host's Python and kernel launches set the pace, which is where a framework's per-step overhead shows;
  figures in µs/step (its own longer warm-up and step count, `mlp_warmup` and `mlp_steps`).

Each variant builds its model from the same seed, then trains `warmup + steps` steps on the same batch:
raw is the hand-written loop (`torch.autocast("cuda", torch.bfloat16)` around the forward for bf16-mixed);
ours is `Trainer(accelerator="gpu", devices=1, precision=..., logger=False, enable_checkpointing=False,
enable_progress_bar=False, enable_model_summary=False)`; Lightning the same flags. The clock starts after
step `warmup` and stops after the last step, each time after `torch.cuda.synchronize()` (raw: in its loop;
frameworks: a callback's `on_train_batch_end`). Variants run in interleaved rounds in a rotated order; the
ratio to raw is the median over rounds of the ratio within a round. torch's default math settings are kept
(the result file records them, before and after, so a framework that changed them would show).

    PYTHONPATH=. python benchmarks/gpu.py             # about 2-3 minutes on one H100
    PYTHONPATH=. python benchmarks/gpu.py --quick     # 1 round of 20 steps
    PYTHONPATH=. python benchmarks/gpu.py --smoke     # tiny sizes; runs on CPU too (checks the flow only)
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from common import figure, lightning_version, machine_info, paired, write_result
from tables import figures_table
from torch import Tensor, nn
from torch.nn import functional as F

from callbacks import Callback
from trainer import Trainer, TrainModule

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu.json"
FLAGS: dict[str, Any] = dict(devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


@dataclass
class Config:
    models: tuple[str, ...] = ("resnet18", "gpt", "mlp")
    precisions: tuple[str, ...] = ("32-true", "bf16-mixed")
    image_size: int = 224
    image_batch: int = 128
    vocab: int = 16_384
    d_model: int = 512
    heads: int = 8
    layers: int = 6
    seq_len: int = 512
    token_batch: int = 16
    mlp_in: int = 256
    mlp_width: int = 512
    mlp_batch: int = 256
    warmup: int = 10
    steps: int = 40
    mlp_warmup: int = 100
    mlp_steps: int = 2000
    rounds: int = 3
    mlp_rounds: int = 3  # the host-bound MLP's rounds spread widely on a VM's host: more of them, cheaply
    device: str = "cuda"


SMOKE = dict(image_size=16, image_batch=2, vocab=64, d_model=32, heads=2, layers=1, seq_len=16, token_batch=2,
             mlp_in=8, mlp_width=8, mlp_batch=4, warmup=1, steps=1, mlp_warmup=1, mlp_steps=1, rounds=1, mlp_rounds=1)


# --- workloads ---------------------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention, then a 4x GELU MLP, each with a residual."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(cfg.vocab, cfg.d_model), nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.Sequential(*[Block(cfg.d_model, cfg.heads) for _ in range(cfg.layers)])
        self.ln, self.head = nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


@dataclass
class Workload:
    """What every variant of one model shares: how to build the net, its batch, loss and optimizer."""

    build: Callable[[], nn.Module]
    batch: tuple[Tensor, Tensor]
    loss: Callable[[nn.Module, tuple[Tensor, Tensor]], Tensor]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    items_per_step: int
    unit: str
    warmup: int
    steps: int


def make_workload(model: str, cfg: Config) -> Workload:
    gen = torch.Generator(device=cfg.device).manual_seed(0)
    if model == "mlp":
        x = torch.randn(cfg.mlp_batch, cfg.mlp_in, device=cfg.device, generator=gen)
        y = torch.randint(0, 10, (cfg.mlp_batch,), device=cfg.device, generator=gen)
        w = cfg.mlp_width
        return Workload(lambda: nn.Sequential(nn.Linear(cfg.mlp_in, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                                              nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)),
                        (x, y), lambda net, b: F.cross_entropy(net(b[0]), b[1]),
                        lambda net: torch.optim.Adam(net.parameters(), lr=1e-3), 1, "µs/step",
                        cfg.mlp_warmup, cfg.mlp_steps)
    if model == "resnet18":
        from torchvision.models import resnet18

        x = torch.randn(cfg.image_batch, 3, cfg.image_size, cfg.image_size, device=cfg.device, generator=gen)
        y = torch.randint(0, 1000, (cfg.image_batch,), device=cfg.device, generator=gen)
        return Workload(lambda: resnet18(weights=None), (x, y), lambda net, b: F.cross_entropy(net(b[0]), b[1]),
                        lambda net: torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), cfg.image_batch,
                        "images/s", cfg.warmup, cfg.steps)
    tokens = torch.randint(0, cfg.vocab, (cfg.token_batch, cfg.seq_len + 1), device=cfg.device, generator=gen)
    return Workload(lambda: TinyGPT(cfg), (tokens[:, :-1], tokens[:, 1:]),
                    lambda net, b: F.cross_entropy(net(b[0]).flatten(0, 1), b[1].flatten()),
                    lambda net: torch.optim.AdamW(net.parameters(), lr=3e-4), cfg.token_batch * cfg.seq_len,
                    "tokens/s", cfg.warmup, cfg.steps)


class Repeat:
    """The same batch `n` times: a loader with a length that is not a list (a list means several loaders)."""

    def __init__(self, batch: Any, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        return (self.batch for _ in range(self.n))


class Clock:
    """Synchronizes and stamps after step `warmup` and after the last step; the seconds between, in wall time and in
    the host thread's CPU time (what a host-bound step spends; other work on the host inflates only the wall time)."""

    def __init__(self, work: Workload, cfg: Config) -> None:
        self.warmup, self.last, self.cuda = work.warmup, work.warmup + work.steps, cfg.device == "cuda"
        self.done, self.start, self.seconds = 0, 0.0, 0.0
        self.cpu_start, self.cpu_seconds = 0.0, 0.0

    def step_end(self) -> None:
        self.done += 1
        if self.done in (self.warmup, self.last):
            if self.cuda:
                torch.cuda.synchronize()
            now, cpu = time.perf_counter(), time.thread_time()
            if self.done == self.warmup:
                self.start, self.cpu_start = now, cpu
            else:
                self.seconds, self.cpu_seconds = now - self.start, cpu - self.cpu_start


# --- variants ----------------------------------------------------------------------------------------------
def run_raw(work: Workload, precision: str, cfg: Config) -> Clock:
    torch.manual_seed(0)
    net = work.build().to(cfg.device)
    opt, clock = work.optimizer(net), Clock(work, cfg)
    autocast = torch.autocast(cfg.device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    net.train()
    for batch in Repeat(work.batch, work.warmup + work.steps):
        with autocast:
            loss = work.loss(net, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        clock.step_end()
    return clock


def module_for(base: type, work: Workload) -> nn.Module:
    """`work` as a subclass of `base` (our TrainModule or Lightning's LightningModule)."""

    class Module(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = work.build()

        def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            return work.loss(self.net, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return work.optimizer(self.net)

    return Module()


class Timer(Callback):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.clock.step_end()


def run_ours(work: Workload, precision: str, cfg: Config) -> Clock:
    clock = Clock(work, cfg)
    accelerator = "gpu" if cfg.device == "cuda" else "cpu"
    trainer = Trainer(accelerator=accelerator, precision=precision, callbacks=[Timer(clock)], **FLAGS)
    trainer.fit(module_for(TrainModule, work), train_dataloaders=Repeat(work.batch, work.warmup + work.steps))
    return clock


def run_lightning(work: Workload, precision: str, cfg: Config) -> Clock:
    import lightning.pytorch as pl

    class LitTimer(pl.Callback):
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.clock.step_end()

    clock = Clock(work, cfg)
    accelerator = "gpu" if cfg.device == "cuda" else "cpu"
    trainer = pl.Trainer(accelerator=accelerator, precision=precision, callbacks=[LitTimer(clock)], **FLAGS)
    trainer.fit(module_for(pl.LightningModule, work), train_dataloaders=Repeat(work.batch, work.warmup + work.steps))
    return clock


# --- measurement -------------------------------------------------------------------------------------------
def math_settings() -> dict[str, Any]:
    return {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32, "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def per_step(work: Workload, seconds: float) -> float:
    """The figure one timed run gives: µs per step for the host-bound MLP, items per second for the others."""
    if work.unit == "µs/step":
        return seconds / work.steps * 1e6
    return work.items_per_step * work.steps / seconds


def measure(cfg: Config, variants: dict[str, Callable[[Workload, str, Config], Clock]]) -> dict[str, Any]:
    """{model: {precision: {variant: [throughput per round]}}}, the host-bound MLP's host CPU µs per step likewise,
    and peak memory per variant (last round)."""
    out: dict[str, Any] = {}
    host_cpu: dict[str, Any] = {}
    peak: dict[str, float] = {}
    names = list(variants)
    started = time.perf_counter()
    for model in cfg.models:
        work = make_workload(model, cfg)
        for precision in cfg.precisions:
            cell: dict[str, list[float]] = {n: [] for n in names}
            cpu_cell: dict[str, list[float]] = {n: [] for n in names}
            for rnd in range(cfg.mlp_rounds if model == "mlp" else cfg.rounds):
                for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                    gc.collect()  # the previous variant's model and optimizer state
                    if cfg.device == "cuda":
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                    clock = variants[name](work, precision, cfg)
                    cell[name].append(per_step(work, clock.seconds))
                    cpu_cell[name].append(clock.cpu_seconds / work.steps * 1e6)
                    if cfg.device == "cuda":
                        peak[f"{model}/{precision}/{name}"] = torch.cuda.max_memory_allocated() / 2**20
                print(f"{model:8s} {precision:10s} round {rnd + 1}: " + ", ".join(
                    f"{n} {cell[n][-1]:,.0f}" for n in names) + f" {work.unit}  "
                    f"({time.perf_counter() - started:.0f} s)", flush=True)
            out.setdefault(model, {})[precision] = cell
            if model == "mlp":
                host_cpu.setdefault(model, {})[precision] = cpu_cell
    return {"throughput": out, "host_cpu_us_per_step": host_cpu, "peak_memory_mib": peak}


def figures(cfg: Config, throughput: dict[str, Any], host_cpu: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Throughput rows per model, precision and variant, each against the raw loop of its round; the host-bound MLP
    with issue 25's target (≤ 1.02x the raw loop's step time), and its host CPU time per step beside it."""
    titles = {"resnet18": "ResNet-18", "gpt": "GPT", "mlp": "MLP (host-bound)", "mlp_cpu": "MLP (host CPU time)"}
    units = {"resnet18": "images/s", "gpt": "tokens/s", "mlp": "µs/step", "mlp_cpu": "CPU µs/step"}
    out = []
    rows = dict(throughput)
    if host_cpu and "mlp" in host_cpu:
        rows["mlp_cpu"] = host_cpu["mlp"]
    for model, by_precision in rows.items():
        for precision, cell in by_precision.items():
            for name, values in cell.items():
                role = "baseline" if name == "raw" else name
                label = {"raw": "raw loop", "ours": "ours", "lightning": "Lightning"}[name]
                step_time = units[model].endswith("µs/step")  # lower is better; issue 25's target on the wall time
                out.append(figure(
                    f"{model}_{precision}_{name}", f"{titles[model]}, {precision}: {label}", values, units[model],
                    role=role, better="lower" if step_time else "higher",  # type: ignore[arg-type]
                    baseline=None if name == "raw" else f"{model}_{precision}_raw",
                    ratios=None if name == "raw" else paired(values, cell["raw"]),
                    target=1.02 if model == "mlp" and name == "ours" else None))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 10 + 20 steps (MLP: 100 + 300)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 round of 1 + 1 steps; CPU allowed")
    parser.add_argument("--models", default="resnet18,gpt,mlp", help="comma-separated: resnet18,gpt,mlp")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; 1 with --quick)")
    parser.add_argument("--mlp-rounds", type=int, help="interleaved rounds of the host-bound MLP (default: --rounds)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    cfg = Config(models=tuple(m for m in args.models.split(",") if m))
    if args.quick:
        cfg.rounds, cfg.steps, cfg.mlp_steps = 1, 20, 300
    if args.rounds:
        cfg.rounds = args.rounds
    cfg.mlp_rounds = args.mlp_rounds or cfg.rounds
    if args.smoke:
        cfg = Config(**{**asdict(cfg), **SMOKE})
    if not torch.cuda.is_available():
        if not args.smoke:
            print("benchmarks/gpu.py: CUDA is not available (torch.cuda.is_available() is False). This benchmark "
                  "measures GPU throughput and needs a CUDA device; `--smoke` checks its flow on CPU.",
                  file=sys.stderr)
            return 2
        cfg.device = "cpu"
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    variants: dict[str, Callable[[Workload, str, Config], Clock]] = {"raw": run_raw, "ours": run_ours}
    if not args.no_lightning and lightning_version() is not None:
        variants["lightning"] = run_lightning
    gpu: dict[str, Any] = {"device": cfg.device}
    if cfg.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu |= {"gpu": torch.cuda.get_device_name(0), "capability": f"{props.major}.{props.minor}",
                "gpu_memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version()}
    settings_before = math_settings()
    started = time.perf_counter()
    measured = measure(cfg, variants)
    elapsed = time.perf_counter() - started
    figs = figures(cfg, measured["throughput"], measured["host_cpu_us_per_step"])
    print()
    print(figures_table(figs))
    import torchvision

    write_result(args.out, "gpu", figs, mode="smoke" if args.smoke else "quick" if args.quick else "full",
                 config=asdict(cfg), elapsed_s=elapsed,
                 machine=machine_info(lightning=lightning_version(), torchvision=torchvision.__version__, **gpu),
                 throughput=measured["throughput"], host_cpu_us_per_step=measured["host_cpu_us_per_step"],
                 peak_memory_mib=measured["peak_memory_mib"],
                 math_settings={"before": settings_before, "after": math_settings()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
