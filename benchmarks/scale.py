"""Cost as the world grows: ddp and zero3 on 1, 2, 4 and 8 CPU ranks, ours against a raw torch script (issue 43).

Every figure is per rank, at each world size, for each strategy (a `Case`):

- model state: bytes of this rank's parameters (local shards of DTensors), gradients (after their reduction) and
  optimizer state (Adam), after a step, each storage counted once; against the formula of docs/zero.md
  (fp32 + Adam: 16 bytes a parameter, divided by the world size under zero3). DDP's own gradient buckets are not
  model state and are not counted (zero_memory.py shows them in the peak RSS). Target: within 10 % of the formula;
- the CPU time of the rank's main thread per steady step (`time.thread_time`, median), ours and the raw script's,
  and the difference: what our loop costs beyond the script on that rank. Eight ranks share two cores here, so the
  times carry the machine's noise; the next figure does not;
- the Python lines of our own packages (trainer/, strategies/, callbacks/) the main thread runs per steady step,
  counted with `sys.settrace` over a few extra steps after the timed ones: deterministic, and it grows with the
  world size exactly where our per-step code loops over ranks;
- the bytes the rank sends per steady step (the `wchar` of /proc/self/io: gloo's sockets are the only writes then),
  ours and raw, against the formula of the collectives (ddp: the gradients' ring all-reduce; zero3: two all-gathers
  of the parameters and the gradients' reduce-scatter, which gloo carries as an all-reduce);
- launch to first step: seconds from `python <script>` to rank 0's first training step, ours (the script re-run per
  rank, `strategy=...`, `devices=W`) and raw (`torch.multiprocessing.spawn`), one launch each.

The fits run on ranks forked from this process (benchmarks/forked_ranks.py: each joins the world through the
environment, as under torchrun), the raw script and ours alternately at each world size. The slope of each figure
against the world size, extrapolated to 64 and 512 ranks, and what in our code grows with the world, are in
docs/benchmarks.md. A new strategy (model_parallel, once it lands) is one more `Case` in `CASES`.

    .venv/bin/python benchmarks/scale.py                       # 1, 2, 4, 8 ranks; ddp and zero3 (about 10 min)
    .venv/bin/python benchmarks/scale.py --quick               # 1 and 2 ranks, fewer steps, no launches
    .venv/bin/python benchmarks/scale.py --worlds 1,2,4 --cases ddp
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "scale.json"
REPO = Path(__file__).resolve().parents[1]
OURS = tuple(str(REPO / package) + os.sep for package in ("trainer", "strategies", "callbacks"))
MiB = 2**20


@dataclass
class Config:
    widths: tuple[int, ...] = (256, 1024, 1024, 16)  # every weight's and bias's first dim divides by 8: no padding
    batch_size: int = 32  # per rank
    warmup: int = 5
    steps: int = 20
    traced_steps: int = 3
    timeout: float = 600.0


# --- the workload ------------------------------------------------------------------------------------------
def make_net(cfg: Config) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(cfg.widths, cfg.widths[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def num_params(cfg: Config) -> int:
    return sum(a * b + b for a, b in zip(cfg.widths, cfg.widths[1:], strict=False))


def make_data(cfg: Config, world: int) -> TensorDataset:
    """Exactly the batches the run needs, on every rank (DistributedSampler splits them)."""
    n = cfg.batch_size * world * (cfg.warmup + cfg.steps + cfg.traced_steps + 1)
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, cfg.widths[0], generator=gen), torch.randint(0, cfg.widths[-1], (n,),
                                                                                      generator=gen))


def shard_raw(net: nn.Module, world: int) -> nn.Module:
    """The hand-written FSDP2 wrap our zero3 does: every module that owns parameters a unit, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for module in net.modules():
        if module is not net and any(True for _ in module.parameters(recurse=False)):
            fully_shard(module, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def wrap_raw_ddp(net: nn.Module, world: int) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(net)


@dataclass(frozen=True)
class Case:
    """One strategy of the study: our Trainer's flag, the raw script's wrap, and the model-state formula."""

    name: str
    strategy: str
    wrap_raw: Callable[[nn.Module, int], nn.Module]
    state_divisor: Callable[[int], int]  # the model state per rank is 16 bytes a parameter divided by this
    sends: Callable[[int], float]  # bytes a rank sends per step, in units of the parameters' fp32 bytes


CASES: dict[str, Case] = {
    # ring all-reduce of the gradients: 2 (W - 1) / W of their bytes
    "ddp": Case("ddp", "ddp", wrap_raw_ddp, lambda w: 1, lambda w: 2 * (w - 1) / w),
    # all-gather of the parameters in forward and again in backward (resharded after forward): (W - 1) / W each;
    # the gradients' reduce-scatter, which on gloo costs an all-reduce: 2 (W - 1) / W (measured, raw and ours alike)
    "zero3": Case("zero3", "zero3", shard_raw, lambda w: w, lambda w: 4 * (w - 1) / w),
    # model_parallel (being added by another developer): its Trainer flag, the raw script's parallelize_module +
    # fully_shard wrap on a 2-D mesh, and its formulas. Nothing else here changes.
}


# --- what a rank measures -----------------------------------------------------------------------------------
def _wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def _model_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    from zero_memory import optimizer_state_tensors, tensor_bytes

    params = tensor_bytes(module.parameters())
    grads = tensor_bytes(p.grad for p in module.parameters())
    state = tensor_bytes(optimizer_state_tensors(optimizer))
    return {"params": params, "grads": grads, "optimizer_state": state, "total": params + grads + state}


class _LineCounter:
    """Counts the lines of our packages the calling thread runs while on (sys.settrace, our frames only)."""

    def __init__(self) -> None:
        self.lines = 0

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._local

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        return self._local if frame.f_code.co_filename.startswith(OURS) else None

    def on(self) -> None:
        sys.settrace(self._global)

    def off(self) -> None:
        sys.settrace(None)


class Stepper:
    """Called after every training step (raw: in its loop; ours: from on_train_batch_end): stamps CPU time and the
    bytes written, then counts our lines over `traced_steps` more steps."""

    def __init__(self, cfg: Config) -> None:
        self.cfg, self.done = cfg, 0
        self.cpu: list[float] = []
        self.wchar: list[int] = []
        self.lines = _LineCounter()
        self.first_step_s = 0.0
        self._started = time.perf_counter()

    def after_step(self) -> None:
        self.done += 1
        cfg = self.cfg
        if self.done == 1:
            self.first_step_s = time.perf_counter() - self._started
        if cfg.warmup <= self.done <= cfg.warmup + cfg.steps:
            self.cpu.append(time.thread_time())
            self.wchar.append(_wchar())
        if self.done == cfg.warmup + cfg.steps:
            self.lines.on()
        elif self.done == cfg.warmup + cfg.steps + cfg.traced_steps:
            self.lines.off()

    def result(self) -> dict[str, Any]:
        cpu = [b - a for a, b in zip(self.cpu, self.cpu[1:], strict=False)]
        return {"cpu_us_per_step": statistics.median(cpu) * 1e6,
                "sent_bytes_per_step": (self.wchar[-1] - self.wchar[0]) / (len(self.wchar) - 1),
                "our_lines_per_step": self.lines.lines / self.cfg.traced_steps, "setup_to_first_step_s":
                    self.first_step_s}


def run_raw_rank(rank: int, case: Case, world: int, cfg: Config) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    stepper = Stepper(cfg)
    dist.init_process_group("gloo")
    data = make_data(cfg, world)
    model = case.wrap_raw(make_net(cfg), world)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=cfg.batch_size, sampler=DistributedSampler(data, world, rank, seed=0))
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if stepper.done == cfg.warmup:
            state = _model_state(model, optimizer)
        stepper.after_step()
    return {**stepper.result(), "model_state_bytes": state}


def run_ours_rank(rank: int, case: Case, world: int, cfg: Config) -> dict[str, Any]:
    from callbacks import Callback
    from trainer import Trainer, TrainModule

    stepper = Stepper(cfg)
    measured: dict[str, Any] = {}

    class Module(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net(cfg)

        def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Probe(Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if stepper.done == cfg.warmup:
                measured["model_state_bytes"] = _model_state(module, trainer.optimizers[0])
            stepper.after_step()

    trainer = Trainer(strategy=case.strategy, accelerator="cpu", devices=world, max_epochs=1, callbacks=[Probe()],
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Module(), DataLoader(make_data(cfg, world), batch_size=cfg.batch_size))
    return {**stepper.result(), **measured}


def fit(variant: str, case: Case, world: int, cfg: Config) -> list[dict[str, Any]]:
    """One fit of `variant` on `world` forked ranks; each rank's figures."""
    from forked_ranks import run_forked

    runner = run_ours_rank if variant == "ours" else run_raw_rank
    return run_forked(lambda rank: runner(rank, case, world, cfg), f"{variant} {case.name} x{world}", world,
                      cfg.timeout)


# --- launch to first step ----------------------------------------------------------------------------------
def launch_child(variant: str, case_name: str, world: int, stamp: str) -> None:
    """What `python scale.py --launch-child ...` runs: one short fit whose rank 0 writes the wall clock at its first
    step (ours re-runs this script for the other ranks)."""
    cfg, case = Config(steps=1, warmup=0, traced_steps=0), CASES[case_name]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)

    def stamp_first() -> None:
        if not Path(stamp).exists():
            Path(stamp).write_text(repr(time.time()))

    if variant == "raw":
        import torch.multiprocessing as mp

        from strategies.comm.distributed import find_free_port

        mp.spawn(_launch_raw_rank, args=(case_name, world, find_free_port(), stamp), nprocs=world)
        return
    from trainer import Trainer, TrainModule

    class Module(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net(cfg)

        def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            if self.global_rank == 0:
                stamp_first()
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    trainer = Trainer(strategy=case.strategy, accelerator="cpu", devices=world, max_steps=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, default_root_dir=str(Path(stamp).parent))
    trainer.fit(Module(), DataLoader(make_data(cfg, world), batch_size=cfg.batch_size))


def _launch_raw_rank(rank: int, case_name: str, world: int, port: int, stamp: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = Config(steps=1, warmup=0, traced_steps=0)
    model = CASES[case_name].wrap_raw(make_net(cfg), world)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = make_data(cfg, world)[:cfg.batch_size]
    if rank == 0:
        Path(stamp).write_text(repr(time.time()))
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    dist.destroy_process_group()


def launch(variant: str, case: Case, world: int) -> float:
    """Seconds from starting `python scale.py --launch-child ...` to rank 0's first step."""
    from common import child_env

    env = child_env(cached_bytecode=True, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory(prefix="scale-launch-") as tmp:
        stamp = Path(tmp) / "first_step.txt"
        started = time.time()
        done = subprocess.run([sys.executable, __file__, "--launch-child", variant, case.name, str(world), str(stamp)],
                              capture_output=True, text=True, cwd=tmp, env=env, timeout=600)
        if not stamp.is_file():
            raise RuntimeError(f"launch {variant} {case.name} x{world} failed ({done.returncode}):\n"
                               f"{done.stderr[-4000:]}")
        return float(stamp.read_text()) - started


# --- the study ---------------------------------------------------------------------------------------------
def measure(cases: list[Case], worlds: list[int], cfg: Config, launches: bool) -> dict[str, Any]:
    """{case: {world: {"ours": [per rank], "raw": [per rank], "launch": {"ours": s, "raw": s}}}}."""
    out: dict[str, Any] = {}
    started = time.perf_counter()
    for case in cases:
        for world in worlds:
            cell: dict[str, Any] = {}
            for variant in ("raw", "ours") if world % 2 else ("ours", "raw"):  # alternate which goes first
                cell[variant] = fit(variant, case, world, cfg)
            if launches:
                cell["launch"] = {variant: launch(variant, case, world) for variant in ("raw", "ours")}
            out.setdefault(case.name, {})[world] = cell
            seconds = time.perf_counter() - started
            print(f"{case.name:6s} x{world}: {describe(case, world, cell, cfg)}  ({seconds:.0f} s)", flush=True)
    return out


def per_world(case: Case, world: int, cell: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """One world size's figures (the largest rank's where ranks differ: the rank that sets the pace)."""
    p = num_params(cfg)
    ours, raw = cell["ours"], cell["raw"]
    formula = 16 * p / case.state_divisor(world)
    state = max(r["model_state_bytes"]["total"] for r in ours)
    cpu_ours = statistics.median(r["cpu_us_per_step"] for r in ours)
    cpu_raw = statistics.median(r["cpu_us_per_step"] for r in raw)
    row = {
        "world": world, "model_state_mib": state / MiB, "formula_mib": formula / MiB,
        "state_vs_formula": state / formula,
        "raw_model_state_mib": max(r["model_state_bytes"]["total"] for r in raw) / MiB,
        "cpu_us_ours": cpu_ours, "cpu_us_raw": cpu_raw, "cpu_us_beyond_raw": cpu_ours - cpu_raw,
        "our_lines_per_step": max(r["our_lines_per_step"] for r in ours),
        "sent_mib_ours": max(r["sent_bytes_per_step"] for r in ours) / MiB,
        "sent_mib_raw": max(r["sent_bytes_per_step"] for r in raw) / MiB,
        "sent_mib_formula": case.sends(world) * 4 * p / MiB,
    }
    row["sent_mib_beyond_raw"] = row["sent_mib_ours"] - row["sent_mib_raw"]
    if "launch" in cell:
        row |= {"launch_s_ours": cell["launch"]["ours"], "launch_s_raw": cell["launch"]["raw"],
                "launch_s_beyond_raw": cell["launch"]["ours"] - cell["launch"]["raw"]}
    return row


def describe(case: Case, world: int, cell: dict[str, Any], cfg: Config) -> str:
    r = per_world(case, world, cell, cfg)
    text = (f"state {r['model_state_mib']:.2f} MiB ({r['state_vs_formula']:.3f}x formula), CPU {r['cpu_us_ours']:.0f} "
            f"vs raw {r['cpu_us_raw']:.0f} us/step, our lines {r['our_lines_per_step']:.0f}/step, sent "
            f"{r['sent_mib_ours']:.2f} vs raw {r['sent_mib_raw']:.2f} MiB/step")
    if "launch_s_ours" in r:
        text += f", launch {r['launch_s_ours']:.1f} vs raw {r['launch_s_raw']:.1f} s"
    return text


def slope(worlds: list[int], values: list[float]) -> tuple[float, float]:
    """Least-squares line through (world, value) over the worlds with several ranks: (per added rank, intercept).
    One rank is left out of the fit: with one process our loop skips the agreement and the collectives altogether,
    a step that does not continue the line."""
    pts = [(w, v) for w, v in zip(worlds, values, strict=True) if w > 1]
    if len(pts) < 2:
        return 0.0, pts[0][1] if pts else 0.0
    mw, mv = statistics.fmean(w for w, _ in pts), statistics.fmean(v for _, v in pts)
    num = sum((w - mw) * (v - mv) for w, v in pts)
    den = sum((w - mw) ** 2 for w, _ in pts)
    k = num / den
    return k, mv - k * mw


# What ours adds to the raw script, per rank, where it is exact. The bytes the collectives themselves send follow their
# formula (at most 2x the gradients' bytes for ddp's ring all-reduce, 4x the parameters' for zero3 on gloo), not a
# line. CPU time and launch beyond the raw script are measured and shown, not extrapolated: with 8 ranks on 2 cores
# their noise (milliseconds, seconds) is far above what our code adds, and a line through it only fits the noise.
EXTRAPOLATED = ("our_lines_per_step", "sent_mib_beyond_raw")


def extrapolate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure: the slope per added rank and its value at 64 and 512 ranks on that line."""
    worlds = [r["world"] for r in rows]
    out = {}
    for key in EXTRAPOLATED:
        if all(key in r for r in rows):
            k, b = slope(worlds, [r[key] for r in rows])
            out[key] = {"per_rank": k, "at_64": k * 64 + b, "at_512": k * 512 + b}
    return out


def figures_for(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The result file's figures: model state per rank against the formula (the target), each world size."""
    from common import figure

    out = []
    for case, rows in summary.items():
        for r in rows:
            w = r["world"]
            out.append(figure(f"{case}_{w}_formula", f"{case}, {w} rank(s): formula", [r["formula_mib"]], "MiB",
                              role="reference"))
            out.append(figure(f"{case}_{w}_state", f"{case}, {w} rank(s): model state per rank (ours)",
                              [r["model_state_mib"]], "MiB", baseline=f"{case}_{w}_formula",
                              ratios=[r["state_vs_formula"]], target=1.10,
                              note="≥ 0.90x too" if r["state_vs_formula"] >= 0.9 else "**below 0.90x**"))
    return out


# --- the plot ----------------------------------------------------------------------------------------------
PANELS = (
    ("model state per rank (MiB)", "model_state_mib", "formula_mib"),
    ("CPU µs per step beyond the raw script", "cpu_us_beyond_raw", None),
    ("our Python lines per step", "our_lines_per_step", None),
    ("MiB sent per rank per step (ours = raw)", "sent_mib_ours", "sent_mib_formula"),
    ("launch to first step: ours - raw (s)", "launch_s_beyond_raw", None),
)


def plot(summary: dict[str, Any], path: Path, title: str) -> None:
    """One panel per figure against the world size (log2 axis), a line per strategy; formulas dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if any(p[1] in r for rows in summary.values() for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0), squeeze=False)
    for ax, (label, key, formula) in zip(axes[0], panels, strict=True):
        for case, rows in summary.items():
            worlds = [r["world"] for r in rows if key in r]
            line = ax.plot(worlds, [r[key] for r in rows if key in r], marker="o", label=case)[0]
            if formula:
                ax.plot(worlds, [r[formula] for r in rows if key in r], linestyle="--", color=line.get_color(),
                        label=f"{case} formula")
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["world"] for r in next(iter(summary.values()))], [str(r["world"]) for r in
                                                                            next(iter(summary.values()))])
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("ranks", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


# --- entry point -------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 2 ranks, fewer steps, no launches")
    parser.add_argument("--worlds", default=None, help="comma-separated world sizes (default 1,2,4,8)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)}")
    parser.add_argument("--no-launch", action="store_true", help="skip the launch-to-first-step runs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT})")
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "img" / "scale_world.png",
                        help="the plot against the world size (default docs/img/scale_world.png)")
    parser.add_argument("--replot", type=Path, default=None, help="run nothing: plot a result file again")
    parser.add_argument("--launch-child", nargs=4, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.launch_child:
        variant, case_name, world, stamp = args.launch_child
        launch_child(variant, case_name, int(world), stamp)
        return 0
    import json

    from common import machine_info, write_result

    if args.replot:  # the summary, the trend and the plot again from the runs a result file holds
        result = json.loads(args.replot.read_text())
        cfg = Config(**{k: v for k, v in result["config"].items() if k in Config.__dataclass_fields__})
        cfg.widths = tuple(cfg.widths)
        result["summary"] = {case: [per_world(CASES[case], int(w), cell, cfg) for w, cell in by_world.items()]
                             for case, by_world in result["runs"].items()}
        result["trend"] = {case: extrapolate(rows) for case, rows in result["summary"].items()}
        result["figures"] = figures_for(result["summary"])
        args.replot.write_text(json.dumps(result, indent=2) + "\n")
        plot(result["summary"], args.plot, f"scale study ({result['mode']}, {result['date'][:10]}): per rank, "
                                            "against the world size")
        return 0
    torch.set_num_threads(1)
    cfg = Config(steps=8, warmup=3, traced_steps=2) if args.quick else Config()
    worlds = [int(w) for w in (args.worlds or ("1,2" if args.quick else "1,2,4,8")).split(",")]
    cases = [CASES[name] for name in args.cases.split(",") if name]
    if max(worlds) > os.cpu_count() * 8:  # type: ignore[operator]
        raise SystemExit(f"{max(worlds)} ranks on {os.cpu_count()} CPUs would take too long; pass --worlds")
    started = time.perf_counter()
    runs = measure(cases, worlds, cfg, launches=not (args.quick or args.no_launch))
    summary = {case: [per_world(CASES[case], w, cell, cfg) for w, cell in by_world.items()]
               for case, by_world in runs.items()}
    trend = {case: extrapolate(rows) for case, rows in summary.items()}
    figures = figures_for(summary)
    mode = "quick" if args.quick else "full"
    write_result(args.out, "scale", figures, mode=mode,
                 config={**asdict(cfg), "params": num_params(cfg), "worlds": worlds, "cases": [c.name for c in cases],
                         "optimizer": "Adam (fp32)"},
                 elapsed_s=time.perf_counter() - started, machine=machine_info(), summary=summary, trend=trend,
                 runs=runs)
    date = time.strftime("%Y-%m-%d")
    plot(summary, args.plot, f"scale study ({mode}, {date}): per rank, against the world size")
    print(f"wrote {args.plot}")
    print(json.dumps(trend, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
