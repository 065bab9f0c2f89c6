"""Framework overhead per training step: our Trainer against a raw torch loop (and Lightning when installed).

The workload is deliberately tiny (an MLP on a 1-thread CPU) so that the per-step cost of the framework's
Python bookkeeping is a visible fraction of the step, not drowned out by the math. Every variant runs in the
same process, on the same data and the same DataLoader setup, in interleaved rounds with a rotated order,
so drift in machine speed (thermal, neighbours, turbo) hits all variants alike.

Per-step time: each variant stamps the clock once per batch, after the optimizer step (raw loop: in the loop;
Trainer and Lightning: a callback's `on_train_batch_end`), through the same `StepClock.tick`. We take the
intervals between consecutive stamps, drop the first `warmup_steps` of each run, and report the median. The
ratio to raw is the median over rounds of the paired ratio (variant / raw in the same round). Wall time
(`perf_counter`) is the headline; per-thread CPU time (`thread_time`) is reported beside it because on a small
shared machine other processes steal the CPU mid-step, which inflates wall time but not CPU time. Whole-fit
wall time covers optimizer creation + the loop for raw, and `Trainer(...)` + `fit()` for the frameworks.

After the timed rounds, one more fit of the raw loop and of ours (no logging) runs under cProfile; the
result file keeps the functions with the most own time per step (docs/benchmarks.md lists them when a target
is missed). `--no-profile` skips it.

    .venv/bin/python benchmarks/overhead.py            # full run (1–2 minutes on an idle machine)
    .venv/bin/python benchmarks/overhead.py --quick    # smoke run (< 60 s)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from common import Role, StepClock, figure, lightning_version, machine_info, quartiles, steady_intervals, write_result
from contract_floor import run_contract_floor
from profiling import profile_top
from tables import figures_table
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, EMAWeightAveraging, ProgressBar
from trainer import Trainer, TrainModule

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "overhead.json"

# No timed targets (issue 43): on these shared machines a run's rounds swing by more than the framework's cost, so
# the per-step targets are on the instruction counts of instructions.py; the timed rows are reported beside them.
TARGETS: dict[str, float] = {}

LABELS: dict[str, str] = {
    "raw": "raw torch loop",
    "raw_ema": "raw torch loop + AveragedModel EMA update every step",
    "raw_bf16": "raw torch loop under CPU bf16 autocast",
    "ours_bf16": "ours, precision='bf16-mixed' (CPU)",
    "lightning_bf16": "Lightning, precision='bf16-mixed' (CPU)",
    "floor": "the hook contract alone (reference: contract_floor.py)",
    "ours": "ours (Trainer)",
    "ours_log": "ours + self.log every step",
    "ours_log_bar": "ours + self.log + progress bar",
    "ours_ema": "ours + EMAWeightAveraging every step",
    "lightning": "Lightning",
    "lightning_log": "Lightning + self.log every step",
    "lightning_log_bar": "Lightning + self.log + progress bar",
    "lightning_ema": "Lightning + EMAWeightAveraging every step",
}


def baseline_of(name: str) -> str | None:
    """The variant a variant is paired with: the raw EMA loop for the EMA rows, the raw loop under the same autocast
    for the bf16 rows, the raw loop for the others; None for the raw loops themselves."""
    if name.startswith("raw"):
        return None
    for suffix in ("_ema", "_bf16"):
        if name.endswith(suffix):
            return f"raw{suffix}"
    return "raw"


def role_of(name: str) -> Role:
    """Who a variant's figure belongs to."""
    if name.startswith("raw"):
        return "baseline"
    return "reference" if name == "floor" else "lightning" if name.startswith("lightning") else "ours"


@dataclass
class Config:
    """What one benchmark invocation runs."""

    samples: int = 20_480
    batch_size: int = 64
    epochs: int = 2
    rounds: int = 10
    warmup_steps: int = 50
    seed: int = 0
    lr: float = 0.01


@dataclass
class Run:
    """One fit of one variant: per-step stamps and the whole-fit wall time."""

    clock: StepClock
    fit_s: float

    def wall_intervals(self, warmup_steps: int) -> list[float]:
        return steady_intervals(self.clock.wall, warmup_steps)

    def cpu_intervals(self, warmup_steps: int) -> list[float]:
        return steady_intervals(self.clock.cpu, warmup_steps)


@dataclass
class VariantResult:
    """Aggregated timings for one variant over all rounds."""

    name: str
    label: str
    median_us: float
    mean_us: float
    step_ratio: float
    step_ratio_iqr: tuple[float, float]
    cpu_median_us: float
    cpu_step_ratio: float
    fit_s: float
    fit_ratio: float
    round_median_us: list[float] = field(default_factory=list)
    round_step_ratios: list[float] = field(default_factory=list)
    round_cpu_step_ratios: list[float] = field(default_factory=list)
    target: float | None = None


# --- workload --------------------------------------------------------------------------------------------
def make_data(cfg: Config) -> TensorDataset:
    """Seeded synthetic regression data: y is a fixed noisy function of x, so the loss actually goes down."""
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.samples, 32, generator=gen)
    w = torch.randn(32, 1, generator=gen)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(cfg.samples, 1, generator=gen)
    return TensorDataset(x, y)


def make_mlp(seed: int) -> nn.Sequential:
    """32-64-64-1 MLP, identically initialised for every variant."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def make_loader(dataset: TensorDataset, cfg: Config) -> DataLoader:
    """The same shuffled loader (same seeded order) for every variant."""
    return DataLoader(
        dataset, batch_size=cfg.batch_size, shuffle=True, generator=torch.Generator().manual_seed(cfg.seed)
    )


# --- variants --------------------------------------------------------------------------------------------
def run_raw(dataset: TensorDataset, cfg: Config, clock: StepClock | None = None, ema: bool = False,
            precision: str = "32-true") -> Run:
    """The baseline: the loop a user would write by hand, with the same per-step stamp the others pay. With `ema`,
    the hand-written EMA every step: torch's `AveragedModel` (the EMA averaging function of decay 0.999, buffers
    averaged too, as both frameworks' EMA callbacks build it) updated after each optimizer step. With
    `precision="bf16-mixed"`, forward and loss under `torch.autocast("cpu", torch.bfloat16)`, built once and entered
    every step (as benchmarks/gpu.py's raw loop does on CUDA)."""
    model, loader, clock = make_mlp(cfg.seed), make_loader(dataset, cfg), clock or StepClock()
    start = time.perf_counter()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    average = AveragedModel(model, avg_fn=get_ema_avg_fn(0.999), use_buffers=True) if ema else None
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    model.train()
    for _ in range(cfg.epochs):
        for x, y in loader:
            with autocast:
                loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if average is not None:
                average.update_parameters(model)
            clock.tick()
    return Run(clock, time.perf_counter() - start)


class OursModule(TrainModule):
    """The same MLP and loss as a TrainModule; `log_every_step` adds one `self.log` per step."""

    def __init__(self, seed: int, lr: float, log_every_step: bool) -> None:
        super().__init__()
        self.net = make_mlp(seed)
        self.lr = lr
        self.log_every_step = log_every_step

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        if self.log_every_step:
            self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class OursStepTimer(Callback):
    """Stamps the end of every training batch (after the optimizer step)."""

    def __init__(self, clock: StepClock | None = None) -> None:
        self.clock = clock or StepClock()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.clock.tick()


# Flags shared by our Trainer and Lightning's: nothing but the loop itself.
TRAINER_FLAGS: dict[str, Any] = dict(
    accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False, num_sanity_val_steps=0,
)


def run_ours(dataset: TensorDataset, cfg: Config, log_every_step: bool, bar: bool = False, ema: bool = False,
             clock: StepClock | None = None, precision: str = "32-true") -> Run:
    """Our Trainer with the timing callback (and, with `bar`, a real tqdm progress bar showing the loss; with `ema`,
    an exponential moving average of the weights updated after every step)."""
    module, loader = OursModule(cfg.seed, cfg.lr, log_every_step), make_loader(dataset, cfg)
    timer = OursStepTimer(clock)
    callbacks: list[Any] = [timer, ProgressBar(plain=False)] if bar else [timer]
    if ema:
        callbacks.insert(0, EMAWeightAveraging(decay=0.999))
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) if bar else contextlib.nullcontext():  # the bar's output
        trainer = Trainer(max_epochs=cfg.epochs, callbacks=callbacks, precision=precision,
                          **{**TRAINER_FLAGS, "enable_progress_bar": bar})
        trainer.fit(module, train_dataloaders=loader)
    return Run(timer.clock, time.perf_counter() - start)


def _lightning_callbacks(timer: Any, ema: bool) -> list[Any]:
    if not ema:
        return [timer]
    from lightning.pytorch.callbacks import EMAWeightAveraging as LitEMA

    return [LitEMA(decay=0.999), timer]


def lightning_runner() -> Callable[..., Run] | None:
    """A runner for Lightning, or None when `lightning` is not installed (it is the optional `.[bench]` extra)."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        return None
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)  # "GPU available: ..." banners

    class LitModule(pl.LightningModule):
        def __init__(self, seed: int, lr: float, log_every_step: bool) -> None:
            super().__init__()
            self.net = make_mlp(seed)
            self.lr = lr
            self.log_every_step = log_every_step

        def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            x, y = batch
            loss = F.mse_loss(self.net(x), y)
            if self.log_every_step:
                self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    class LitStepTimer(pl.Callback):
        def __init__(self, clock: StepClock | None) -> None:
            self.clock = clock or StepClock()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.clock.tick()

    def run(dataset: TensorDataset, cfg: Config, log_every_step: bool, bar: bool = False, ema: bool = False,
            clock: StepClock | None = None, precision: str = "32-true") -> Run:
        module, loader = LitModule(cfg.seed, cfg.lr, log_every_step), make_loader(dataset, cfg)
        timer = LitStepTimer(clock)
        callbacks = _lightning_callbacks(timer, ema)
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) if bar else contextlib.nullcontext():
            trainer = pl.Trainer(max_epochs=cfg.epochs, callbacks=callbacks, precision=precision,
                                 **{**TRAINER_FLAGS, "enable_progress_bar": bar})
            trainer.fit(module, train_dataloaders=loader)
        return Run(timer.clock, time.perf_counter() - start)

    return run


Runner = Callable[..., Run]  # (dataset, cfg, clock=None) -> Run; `clock` replaces the variant's own StepClock


def build_variants(with_lightning: bool, bf16: bool = False) -> dict[str, Runner]:
    """Name → runner, in table order; with `bf16`, the bf16-mixed rows too (instructions.py: CPU autocast)."""
    variants: dict[str, Runner] = {
        "raw": run_raw,
        "raw_ema": lambda d, c, clock=None: run_raw(d, c, clock=clock, ema=True),
        "floor": run_contract_floor,
        "ours": lambda d, c, clock=None: run_ours(d, c, False, clock=clock),
        "ours_log": lambda d, c, clock=None: run_ours(d, c, True, clock=clock),
        "ours_log_bar": lambda d, c, clock=None: run_ours(d, c, True, bar=True, clock=clock),
        "ours_ema": lambda d, c, clock=None: run_ours(d, c, False, ema=True, clock=clock),
    }
    if bf16:
        variants["raw_bf16"] = lambda d, c, clock=None: run_raw(d, c, clock=clock, precision="bf16-mixed")
        variants["ours_bf16"] = lambda d, c, clock=None: run_ours(d, c, False, clock=clock, precision="bf16-mixed")
    lit = lightning_runner() if with_lightning else None
    if lit is not None:
        variants["lightning"] = lambda d, c, clock=None: lit(d, c, False, clock=clock)
        variants["lightning_log"] = lambda d, c, clock=None: lit(d, c, True, clock=clock)
        variants["lightning_log_bar"] = lambda d, c, clock=None: lit(d, c, True, True, clock=clock)
        variants["lightning_ema"] = lambda d, c, clock=None: lit(d, c, False, ema=True, clock=clock)
        if bf16:
            variants["lightning_bf16"] = lambda d, c, clock=None: lit(d, c, False, clock=clock, precision="bf16-mixed")
    return variants


# --- measurement -----------------------------------------------------------------------------------------
def measure(cfg: Config, variants: dict[str, Runner]) -> dict[str, list[Run]]:
    """One discarded warm-up round, then `cfg.rounds` rounds; round r starts at variant r (rotated order)."""
    dataset = make_data(cfg)
    names = list(variants)
    expected = cfg.epochs * -(-cfg.samples // cfg.batch_size)
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for rnd in range(-1, cfg.rounds):
        shift = max(rnd, 0) % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            run = variants[name](dataset, cfg)
            if len(run.clock.wall) != expected:
                raise RuntimeError(f"{name}: {len(run.clock.wall)} steps recorded, expected {expected}")
            if torch.get_num_threads() != 1:  # a framework that changed it would be timed on other terms
                raise RuntimeError(f"{name} changed torch's thread count to {torch.get_num_threads()}")
            if rnd >= 0:
                runs[name].append(run)
    return runs


def summarize(cfg: Config, runs: dict[str, list[Run]]) -> list[VariantResult]:
    """Medians of steady-state step intervals, and ratios paired per round against the variant's raw loop."""
    w = cfg.warmup_steps
    out: list[VariantResult] = []
    for name, variant_runs in runs.items():
        base_runs = runs[baseline_of(name) or name]
        raw_wall = [statistics.median(r.wall_intervals(w)) for r in base_runs]
        raw_cpu = [statistics.median(r.cpu_intervals(w)) for r in base_runs]
        raw_fit = [r.fit_s for r in base_runs]
        pooled = [d for r in variant_runs for d in r.wall_intervals(w)]
        pooled_cpu = [d for r in variant_runs for d in r.cpu_intervals(w)]
        wall = [statistics.median(r.wall_intervals(w)) for r in variant_runs]
        cpu = [statistics.median(r.cpu_intervals(w)) for r in variant_runs]
        step_ratios = [v / b for v, b in zip(wall, raw_wall, strict=True)]
        cpu_ratios = [v / b for v, b in zip(cpu, raw_cpu, strict=True)]
        fit_ratios = [r.fit_s / b for r, b in zip(variant_runs, raw_fit, strict=True)]
        out.append(VariantResult(
            name=name,
            label=LABELS[name],
            median_us=statistics.median(pooled) * 1e6,
            mean_us=statistics.fmean(pooled) * 1e6,
            step_ratio=statistics.median(step_ratios),
            step_ratio_iqr=quartiles(step_ratios),
            cpu_median_us=statistics.median(pooled_cpu) * 1e6,
            cpu_step_ratio=statistics.median(cpu_ratios),
            fit_s=statistics.median(r.fit_s for r in variant_runs),
            fit_ratio=statistics.median(fit_ratios),
            round_median_us=[round(m * 1e6, 1) for m in wall],
            round_step_ratios=[round(x, 4) for x in step_ratios],
            round_cpu_step_ratios=[round(x, 4) for x in cpu_ratios],
            target=TARGETS.get(name),
        ))
    return out



def figures(results: list[VariantResult]) -> list[dict[str, Any]]:
    """The result file's figures: µs/step over rounds (each round's median), ratios paired per round."""
    out = []
    for r in results:
        base = baseline_of(r.name)
        out.append(figure(
            r.name, r.label, r.round_median_us, "µs/step", role=role_of(r.name),
            baseline=base, ratios=None if base is None else r.round_step_ratios, target=r.target,
        ))
    return out


def profile_fits(dataset: TensorDataset, cfg: Config) -> dict[str, Any]:
    """One fit each of the raw loop and of ours (no logging) under cProfile, one epoch."""
    one_epoch = Config(**{**asdict(cfg), "epochs": 1})
    steps = -(-cfg.samples // cfg.batch_size)
    return {"raw": profile_top(lambda: run_raw(dataset, one_epoch), steps),
            "ours": profile_top(lambda: run_ours(dataset, one_epoch, False), steps)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds on 6,400 samples (smoke test, < 60 s)")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (default 10, quick 3)")
    parser.add_argument("--samples", type=int, default=None, help="synthetic samples (default 20480, quick 6400)")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile fits after the timed rounds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # Lightning's num_workers hints would otherwise flood the output
    cfg = Config()
    if args.quick:
        cfg.rounds, cfg.samples = 3, 6_400
    cfg.rounds = args.rounds if args.rounds is not None else cfg.rounds
    cfg.samples = args.samples if args.samples is not None else cfg.samples

    variants = build_variants(with_lightning=not args.no_lightning)
    if "lightning" not in variants and not args.no_lightning:
        print("lightning is not installed: skipping it (pip install -e '.[bench]' to include it)")
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load_before[0]:.1f} on {os.cpu_count()} CPUs; other processes will skew "
              "wall times (the CPU-time columns are less affected)")
    started = time.perf_counter()
    runs = measure(cfg, variants)
    results = summarize(cfg, runs)
    profile = None if args.no_profile else profile_fits(make_data(cfg), cfg)
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()

    figs = figures(results)
    table = figures_table(figs)
    steps = cfg.epochs * -(-cfg.samples // cfg.batch_size)
    print(f"\n{steps} steps per fit, {cfg.rounds} rounds (+1 warm-up), first {cfg.warmup_steps} steps dropped, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread\n")
    print(table)
    print(f"\nbenchmark took {elapsed:.1f} s; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")

    write_result(
        args.out, "overhead", figs, mode="quick" if args.quick else "full", config=asdict(cfg),
        elapsed_s=elapsed, machine=machine_info(lightning=lightning_version()),
        results=[asdict(r) for r in results], profile=profile,
        load_average_1min={"before": round(load_before[0], 2), "after": round(load_after[0], 2)}, table=table,
    )


if __name__ == "__main__":
    main()
