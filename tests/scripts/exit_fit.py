"""One tiny 2-rank fit with the Trainer's defaults (TensorBoard logger, checkpointing), then code after fit.

Run by tests/scripts/exit_stress.py, which counts how runs end. Every rank's last collective runs at exit: an
async sum with a Python callback (`sum_at_exit`). `--raw` runs the same training as a hand-written DDP script that
leaves its process group to interpreter shutdown (the baseline):

    python tests/scripts/exit_fit.py --strategy ddp --out OUT
    torchrun --standalone --nproc_per_node 2 tests/scripts/exit_fit.py --out OUT [--raw]
    python tests/scripts/exit_fit.py --raw --out OUT        # raw torch.multiprocessing.spawn

Every process that runs this file appends its pid to OUT/pids.txt; every rank prints `RANK_DONE <rank>` after
its training and the launching process prints `AFTER_FIT` once `fit()` returned.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from trainer import Trainer, TrainModule  # noqa: E402


class Tiny(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def on_fit_end(self) -> None:
        print(f"RANK_DONE {self.global_rank}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 4, generator=gen), torch.randn(64, 1, generator=gen))


def _raw_rank(local_rank: int, port: int | None) -> None:
    """A hand-written DDP loop that leaves the process group to interpreter shutdown (no destroy)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    if port is not None:  # mp.spawn: this process sets up its own rank variables
        os.environ.update(RANK=str(local_rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = _data()
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    for x, y in DataLoader(data, batch_size=8, sampler=sampler):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    print(f"RANK_DONE {dist.get_rank()}", flush=True)
    sum_at_exit(len(sampler))


def sum_at_exit(steps: int) -> None:
    """The script's last collective runs at interpreter exit (atexit, right before finalization): an async sum of
    the ranks' step counts whose result a Python callback reads, as a script that logs a total when it arrives.
    The callback runs on the gloo worker thread that finishes the sum, which takes the GIL for it after the main
    thread has moved on; the amplifier (tests/scripts/slow_gloo_worker.c) delays that until finalization."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # not in the process that called fit(strategy="ddp_spawn")
        atexit.register(_sum_steps, torch.tensor([float(steps)]))


def _sum_steps(steps: torch.Tensor) -> None:
    import time

    import torch.distributed as dist

    # The other ranks join the sum later, so that rank 0's sum cannot finish before its callback is attached: a future
    # already done when `then` is called runs the callback at once on the main thread, and no gloo worker takes the
    # GIL. On a loaded machine that happened on both ranks in about 1 of 6 amplified raw launches (the control then
    # exited 0: CI, two runs at once on 2 cores), with the ranks arriving here together.
    if dist.get_rank() > 0:
        time.sleep(0.5)
    total = dist.all_reduce(steps, async_op=True).get_future()
    total.then(lambda done: done.value())
    total.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--raw", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pids.txt"), "a") as f:
        f.write(f"{os.getpid()}\n")
    if args.raw:
        if "RANK" in os.environ:
            _raw_rank(int(os.environ["LOCAL_RANK"]), None)
        else:
            from strategies.comm.distributed import find_free_port

            torch.multiprocessing.spawn(_raw_rank, args=(find_free_port(),), nprocs=2)
        print("AFTER_FIT", flush=True)
        return
    torch.set_num_threads(1)
    trainer = Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy=args.strategy,
                      max_epochs=1, default_root_dir=args.out, enable_progress_bar=False, log_every_n_steps=1)
    trainer.fit(Tiny(), DataLoader(_data(), batch_size=8, shuffle=True))
    sum_at_exit(trainer.global_step)
    print("AFTER_FIT", flush=True)


if __name__ == "__main__":
    main()
