"""What the host-bound MLP step of benchmarks/gpu.py does on the host, ours against the raw loop, per precision.

gpu.py times the step; this script says where a difference comes from (issue 43: bf16-mixed measured 1.28x the raw
loop's step there, 32-true 1.016x, and the CPU count of the bf16-specific work in our step is a few microseconds).
On the MLP workload of gpu.py, in 32-true and bf16-mixed:

- `ops`: torch.profiler over steady steps of the raw loop and of ours: the host-side events per step (aten operators,
  `cudaLaunchKernel`, synchronizing CUDA calls), so that an operator or a kernel launch ours adds shows by name;
- `syncs`: host syncs per steady step of ours, without and with `self.log` every step, counted by torch's own check
  (`torch.cuda.set_sync_debug_mode("warn")` warns at every synchronizing call);
- `python`: the Python functions of ours with the most own time per steady step (cProfile), to compare 32-true with
  bf16-mixed.

    PYTHONPATH=. python benchmarks/gpu_diagnose.py --out gpu_diagnose.json     # about 1 minute on one H100
    PYTHONPATH=. python benchmarks/gpu_diagnose.py --smoke --out /tmp/d.json   # tiny, on CPU (flow only)
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import pstats
import sys
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from gpu import FLAGS, SMOKE, Config, Repeat, Workload, make_workload, module_for
from torch import Tensor

from callbacks import Callback
from trainer import Trainer, TrainModule

PRECISIONS = ("32-true", "bf16-mixed")


class _Window:
    """Runs `start()` before steady step `first` and `stop()` after step `first + count - 1` (0-based)."""

    def __init__(self, first: int, count: int, start: Callable[[], Any], stop: Callable[[], Any]) -> None:
        self.first, self.last, self.start, self.stop = first, first + count - 1, start, stop

    def before(self, step: int) -> None:
        if step == self.first:
            self.start()

    def after(self, step: int) -> None:
        if step == self.last:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.stop()


class _WindowCallback(Callback):
    def __init__(self, window: _Window) -> None:
        self.window = window

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.window.before(batch_idx)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.window.after(batch_idx)


def run_raw(work: Workload, precision: str, device: str, window: _Window) -> None:
    """gpu.py's raw loop, with the window's calls around its steady steps."""
    torch.manual_seed(0)
    net = work.build().to(device)
    opt = work.optimizer(net)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    for step, batch in enumerate(Repeat(work.batch, window.last + 1)):
        window.before(step)
        with autocast:
            loss = work.loss(net, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        window.after(step)


def run_ours(work: Workload, precision: str, device: str, window: _Window, log: bool = False) -> None:
    """gpu.py's Trainer run (self.log of the loss every step with `log`), with the window's calls around its steady
    steps."""
    module = module_for(TrainModule, work)
    if log:
        step = type(module).training_step

        def logging_step(self: Any, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            loss = step(self, batch, batch_idx)
            self.log("loss", loss)
            return loss

        type(module).training_step = logging_step  # type: ignore[method-assign]
    trainer = Trainer(accelerator="gpu" if device == "cuda" else "cpu", precision=precision,
                      callbacks=[_WindowCallback(window)], **FLAGS)
    trainer.fit(module, train_dataloaders=Repeat(work.batch, window.last + 1))


def host_ops(work: Workload, precision: str, device: str, warmup: int, steps: int) -> dict[str, Any]:
    """Host-side profiler events per steady step, raw and ours, and what ours has more of."""
    from torch.profiler import ProfilerActivity, profile

    per_variant: dict[str, dict[str, float]] = {}
    for name, runner in (("raw", run_raw), ("ours", run_ours)):
        # CUDA activity too on a GPU: the runtime's kernel launches (cudaLaunchKernel) are recorded with it
        prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else []))
        runner(work, precision, device, _Window(warmup, steps, prof.__enter__, lambda p=prof: p.__exit__(None, None,
                                                                                                          None)))
        counts = collections.Counter(event.key for event in prof.key_averages() for _ in range(event.count))
        per_variant[name] = {key: round(n / steps, 2) for key, n in counts.most_common()}
    raw, ours = per_variant["raw"], per_variant["ours"]
    extra = {key: round(ours.get(key, 0) - raw.get(key, 0), 2) for key in set(raw) | set(ours)
             if ours.get(key, 0) != raw.get(key, 0)}
    launches = {name: sum(n for key, n in events.items() if "LaunchKernel" in key or "cuLaunch" in key)
                for name, events in per_variant.items()}
    return {"launches_per_step": launches, "ours_minus_raw_per_step": dict(sorted(extra.items())),
            "raw_per_step": dict(list(raw.items())[:40]), "ours_per_step": dict(list(ours.items())[:40])}


def host_syncs(work: Workload, precision: str, device: str, warmup: int, steps: int) -> dict[str, Any]:
    """Synchronizing CUDA calls per steady step of ours, plain and with self.log every step (0 on CPU: no check)."""
    out: dict[str, Any] = {}
    for log in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            modes = (lambda: torch.cuda.set_sync_debug_mode("warn"), lambda: torch.cuda.set_sync_debug_mode(0))
            if device != "cuda":
                modes = (lambda: None, lambda: None)
            run_ours(work, precision, device, _Window(warmup, steps, *modes), log=log)
        syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
        out["self.log every step" if log else "plain"] = {"per_step": len(syncs) / steps, "first": syncs[:3]}
    return out


def python_profile(work: Workload, precision: str, device: str, warmup: int, steps: int) -> dict[str, Any]:
    """Ours under cProfile over steady steps: the functions with the most own time per step."""
    prof = cProfile.Profile()
    run_ours(work, precision, device, _Window(warmup, steps, prof.enable, prof.disable))
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(((tt, nc, f"{Path(f).name}:{line}({fn})") for (f, line, fn), (_, nc, tt, _, _) in stats.items()),
                  reverse=True)
    return {"total_us_per_step": round(sum(r[0] for r in rows) / steps * 1e6, 1),
            "calls_per_step": round(sum(r[1] for r in rows) / steps, 1),
            "top": [{"function": where, "calls_per_step": round(nc / steps, 2), "own_us_per_step": round(tt / steps
                                                                                                         * 1e6, 2)}
                    for tt, nc, where in rows[:25]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and few steps; CPU allowed")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    cfg = Config(**SMOKE) if args.smoke else Config()
    if not torch.cuda.is_available():
        if not args.smoke:
            print("gpu_diagnose.py needs CUDA; --smoke checks its flow on CPU", file=sys.stderr)
            return 2
        cfg.device = "cpu"
    warmup, steps = (2, 3) if args.smoke else (100, 200)
    work = make_workload("mlp", cfg)
    result: dict[str, Any] = {"config": asdict(cfg), "warmup": warmup, "steps": steps, "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name(0) if cfg.device == "cuda" else None}
    for precision in PRECISIONS:
        result[precision] = {
            "ops": host_ops(work, precision, cfg.device, warmup, steps),
            "syncs": host_syncs(work, precision, cfg.device, warmup, steps),
            "python": python_profile(work, precision, cfg.device, warmup, steps),
        }
        print(f"{precision}: launches/step {result[precision]['ops']['launches_per_step']}, ours - raw "
              f"{result[precision]['ops']['ours_minus_raw_per_step']}, syncs/step "
              f"{ {k: v['per_step'] for k, v in result[precision]['syncs'].items()} }, ours' Python "
              f"{result[precision]['python']['total_us_per_step']} µs/step under cProfile", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
