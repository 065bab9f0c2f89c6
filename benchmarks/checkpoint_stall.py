"""Training stall per sharded checkpoint save: `sharded_checkpoint=True` (synchronous) vs `"async"`, 2 CPU ranks.

The model is an MLP of ``depth`` x Linear(width, width) (full run: 6 x 2048, 25.2 M parameters, 100.7 MB of fp32
weights; with AdamW's two moments a checkpoint holds 302 MB, 151 MB per rank), trained under ZeRO-3
(`ZeroStrategy(stage=3, sharded_checkpoint=...)`) through our Trainer on 2 gloo CPU ranks, batch 16 per rank, seeded
synthetic data. A callback calls `trainer.save_checkpoint(<folder>)` every ``every`` steps (the way ModelCheckpoint
does) and deletes the previous folder through `trainer.strategy.remove_checkpoint` (deferred to the commit under
async). The ranks are forked as in benchmarks/zero_memory.py, each with one torch thread.

Two figures per mode, the larger of the two ranks:

- blocked: how long `save_checkpoint` kept the training thread (median over the saves but the first, which also
  creates the checkpoint process group). Synchronous: the whole write and commit. Async: staging the CPU copy, and
  waiting for the previous save if it was still running.
- extra wall time per save: (training time with saves - training time without saves) / number of saves, in the
  same round; training time runs from `on_train_start` to the return of `fit` (which waits for the last save).
  This counts what the background writer takes from training (CPU, memory bandwidth, disk) and the end-of-fit
  wait for the last save, which the blocked time alone hides.

Modes run in ``rounds`` rounds in a rotated order, each fit in freshly forked processes; medians over rounds. The
development machine is a shared 2-core VM: the writer thread competes with the two ranks for those cores, so the
extra wall time is the honest figure there; on a machine with free cores (and a GPU doing the step) async hides more.

    .venv/bin/python benchmarks/checkpoint_stall.py            # full run (about 2-4 minutes)
    .venv/bin/python benchmarks/checkpoint_stall.py --quick    # smoke run (< 60 s)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: the repo's packages

import torch  # noqa: E402
from forked_ranks import run_forked  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from callbacks import Callback  # noqa: E402
from strategies import ZeroStrategy  # noqa: E402
from trainer import Trainer, TrainModule, seed_everything  # noqa: E402

WORLD_SIZE = 2
MODES = ("none", "sync", "async")


@dataclass
class Config:
    width: int = 2048
    depth: int = 6
    batch_size: int = 16
    steps: int = 30
    every: int = 5
    rounds: int = 3
    timeout: float = 600.0


class MLP(TrainModule):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Sequential(nn.Linear(cfg.width, cfg.width), nn.ReLU()) for _ in range(cfg.depth)])

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class TimedSaves(Callback):
    """Saves every `every` steps, timing the call on the training thread; keeps only the newest folder."""

    def __init__(self, folder: Path, every: int) -> None:
        self.folder, self.every = folder, every
        self.blocked: list[float] = []
        self.previous: Path | None = None
        self.train_start = 0.0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.train_start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.every or trainer.global_step % self.every:
            return
        path = self.folder / f"step={trainer.global_step}.ckpt"
        start = time.perf_counter()
        trainer.save_checkpoint(path)
        self.blocked.append(time.perf_counter() - start)
        if self.previous is not None:
            trainer.strategy.remove_checkpoint(self.previous)
        self.previous = path


def run_rank(mode: str, cfg: Config, folder: Path) -> dict[str, Any]:
    seed_everything(0)
    data = TensorDataset(torch.randn(cfg.batch_size * WORLD_SIZE * cfg.steps, cfg.width),
                         torch.randn(cfg.batch_size * WORLD_SIZE * cfg.steps, cfg.width))
    saves = TimedSaves(folder, 0 if mode == "none" else cfg.every)
    strategy = ZeroStrategy(stage=3, sharded_checkpoint="async" if mode == "async" else True)
    trainer = Trainer(strategy=strategy, accelerator="cpu", devices=WORLD_SIZE, max_steps=cfg.steps,
                      callbacks=[saves], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(MLP(cfg), DataLoader(data, batch_size=cfg.batch_size))  # returns after the last save committed
    return {"fit_s": time.perf_counter() - saves.train_start, "blocked_s": saves.blocked}


def run_mode(mode: str, cfg: Config) -> list[dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix=f"stall-{mode}-"))
    try:
        return run_forked(lambda rank: run_rank(mode, cfg, folder), mode, WORLD_SIZE, cfg.timeout, join_timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)



def summarize(rounds: list[dict[str, list[dict[str, Any]]]], cfg: Config) -> dict[str, Any]:
    saves = cfg.steps // cfg.every
    out: dict[str, Any] = {}
    for mode in ("sync", "async"):
        blocked = [max(statistics.median(rank["blocked_s"][1:] or rank["blocked_s"]) for rank in r[mode])
                   for r in rounds]
        extra = [(max(rank["fit_s"] for rank in r[mode]) - max(rank["fit_s"] for rank in r["none"])) / saves
                 for r in rounds]
        out[mode] = {"blocked_ms": 1000 * statistics.median(blocked), "extra_wall_per_save_ms":
                     1000 * statistics.median(extra), "blocked_ms_rounds": [1000 * b for b in blocked],
                     "extra_ms_rounds": [1000 * e for e in extra]}
    out["none"] = {"fit_s": statistics.median(max(rank["fit_s"] for rank in r["none"]) for r in rounds)}
    return out


def main() -> None:
    import torch.distributed.checkpoint  # noqa: F401 - imported once here, not in every forked rank's timing
    import torch.distributed.fsdp  # noqa: F401

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model and one round (smoke run)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    cfg = Config(width=512, depth=2, steps=10, every=5, rounds=1) if args.quick else Config()
    if args.rounds:
        cfg.rounds = args.rounds
    params = cfg.depth * (cfg.width * cfg.width + cfg.width)
    print(f"MLP {cfg.depth} x Linear({cfg.width}, {cfg.width}): {params / 1e6:.1f} M parameters, "
          f"{params * 4 / 1e6:.1f} MB fp32; checkpoint with AdamW {params * 12 / 1e6:.0f} MB; "
          f"{cfg.steps} steps, a save every {cfg.every}; {cfg.rounds} round(s)", flush=True)
    rounds = []
    for i in range(cfg.rounds):
        order = MODES[i % 3:] + MODES[:i % 3]
        rounds.append({mode: run_mode(mode, cfg) for mode in order})
        print(f"round {i + 1}: " + ", ".join(f"{m} fit {max(r['fit_s'] for r in rounds[-1][m]):.2f} s"
                                             for m in MODES), flush=True)
    summary = summarize(rounds, cfg)
    print("| mode | blocked per save (median) | extra wall time per save |")
    print("| --- | --- | --- |")
    for mode, label in (("sync", "`sharded_checkpoint=True`"), ("async", '`sharded_checkpoint="async"`')):
        print(f"| {label} | {summary[mode]['blocked_ms']:.0f} ms | {summary[mode]['extra_wall_per_save_ms']:.0f} ms |")
    if args.out is not None:
        args.out.write_text(json.dumps({"config": asdict(cfg), "summary": summary, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
