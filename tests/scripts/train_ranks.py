"""Train a tiny seeded model on every rank and dump what each rank ended with; run by tests/strategies/test_launch.py.

    python tests/scripts/train_ranks.py --devices 2 --out OUT                  # our own launcher
    torchrun --standalone --nproc_per_node 2 tests/scripts/train_ranks.py --devices 2 --out OUT

Every process that runs this script appends its pid to `OUT/pids.txt` (a test counts how many processes ran it).
Every rank writes `OUT/rank<global_rank>.pt` at the end of fit (from a callback, so spawned ranks write one too):
the initial and final state_dict, global_step, world_size, node_rank, local_rank and pid. The process that called
`fit()` then writes `OUT/fit<pid>.pt` with what its Trainer reports afterwards (for ddp_spawn: rank 0's adopted
outcome).

Fault injection (test-only): `TRAIN_RANKS_FAIL=<rank>:<step>` raises `RuntimeError(INJECTED ...)` on that global rank
in `on_train_batch_start` at that global step, after writing the wall-clock time to `OUT/injected_at.txt`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `python tests/scripts/train_ranks.py` puts only tests/scripts/ on the path
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from callbacks import Callback  # noqa: E402
from tests.helpers.boring import BoringModel  # noqa: E402
from trainer import Trainer, seed_everything  # noqa: E402

SEED = 1234
FAIL_ENV = "TRAIN_RANKS_FAIL"
INJECTED = "INJECTED FAILURE"


def _cpu_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


class RankDump(Callback):
    """Writes this rank's outcome at the end of fit, in whichever process the rank runs."""

    def __init__(self, out: str, initial: dict[str, torch.Tensor]) -> None:
        self.out = out
        self.initial = initial

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        record = {
            "initial": self.initial, "state_dict": _cpu_state(module), "global_step": trainer.global_step,
            "global_rank": trainer.global_rank, "world_size": trainer.world_size, "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank, "pid": os.getpid(),
        }
        torch.save(record, os.path.join(self.out, f"rank{trainer.global_rank}.pt"))


class FailAt(Callback):
    """Raises on one global rank at one global step (test-only fault injection)."""

    def __init__(self, out: str, rank: int, step: int) -> None:
        self.out, self.rank, self.step = out, rank, step

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            with open(os.path.join(self.out, "injected_at.txt"), "w") as f:  # wall clock, for the test's bound
                f.write(repr(time.time()))
            raise RuntimeError(f"{INJECTED} on rank {self.rank} at step {self.step}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pids.txt"), "a") as f:  # one short append per process: no interleaving
        f.write(f"{os.getpid()}\n")

    torch.set_num_threads(1)
    seed_everything(SEED)
    model = BoringModel()
    callbacks: list[Callback] = [RankDump(args.out, _cpu_state(model))]
    if os.environ.get(FAIL_ENV):
        rank, step = (int(v) for v in os.environ[FAIL_ENV].split(":"))
        callbacks.append(FailAt(args.out, rank, step))
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy=args.strategy, max_epochs=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(model)
    record = {
        "state_dict": _cpu_state(model), "global_step": trainer.global_step, "global_rank": trainer.global_rank,
        "world_size": trainer.world_size, "pid": os.getpid(),
    }
    torch.save(record, os.path.join(args.out, f"fit{os.getpid()}.pt"))


if __name__ == "__main__":
    main()
