"""A tiny seeded run with one injected fault, for the fault-injection tests (tests/reliability). Test-only.

    python tests/scripts/faults.py --out OUT --fault raise@1:3                     # our own launcher, 2 ranks
    torchrun --standalone --nproc_per_node 2 tests/scripts/faults.py --out OUT --fault sigterm@1:2

`--fault MODE@RANK:STEP` fires on that global rank at that global step (RANK may be `all`). Modes:
raise, sigkill, sigterm, sigusr1, hang, nan_loss, return_none, sync_dist_one_rank, log_dict_keys, extra_collective
(all in training_step), save_hook_raise (in on_save_checkpoint), save_enospc (fsync fails while saving),
sigkill_in_sharded_save (after this rank's DCP shard is written, before the manifest; with --sharded), and
raise_once (raise unless OUT/fired exists; creates it: a one-time fault for torchrun --max-restarts).

Every process appends its pid to OUT/pids.txt. Each rank that finishes fit writes OUT/rank<r>.pt (final weights,
global step, per-step losses). OUT/fired_at.txt gets the wall-clock time of the fault.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from callbacks import Callback, ModelCheckpoint  # noqa: E402
from strategies import DDPStrategy, ZeroStrategy  # noqa: E402
from tests.helpers.boring import BoringModel  # noqa: E402
from trainer import Trainer, seed_everything  # noqa: E402

INJECTED = "INJECTED FAILURE"


class Fault:
    def __init__(self, spec: str | None, out: Path) -> None:
        self.mode, self.rank, self.step = "", -1, -1
        self.out = out
        self.done = False  # a fault fires once per process (a skipped step does not advance global_step)
        if spec:
            self.mode, where = spec.split("@")
            rank, step = where.split(":")
            self.rank, self.step = (-1 if rank == "all" else int(rank)), int(step)

    def here(self, trainer: Any, *modes: str) -> bool:
        return (self.mode in modes and trainer.global_step == self.step and not self.done
                and (self.rank in (-1, trainer.global_rank)))

    def fired(self) -> None:
        self.done = True
        with open(self.out / "fired_at.txt", "w") as f:
            f.write(repr(time.time()))


class FaultyModel(BoringModel):
    """BoringModel whose training_step misbehaves as told, and records its losses."""

    def __init__(self, fault: Fault) -> None:
        super().__init__()
        self.fault = fault
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        f, t = self.fault, self.trainer
        if f.here(t, "raise") or (f.here(t, "raise_once") and not (f.out / "fired").exists()):
            (f.out / "fired").touch()
            f.fired()
            raise RuntimeError(f"{INJECTED} on rank {t.global_rank} at step {t.global_step}")
        if f.here(t, "sigkill", "sigterm", "sigusr1", "hang"):
            f.fired()
            if f.mode == "hang":
                time.sleep(3600)
            os.kill(os.getpid(), {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM,
                                  "sigusr1": signal.SIGUSR1}[f.mode])
        loss = self.layer(batch).sum()
        if f.here(t, "nan_loss"):
            f.fired()
            loss = loss * float("nan")
        if f.here(t, "return_none"):
            f.fired()
            return None
        if f.here(t, "sync_dist_one_rank"):
            f.fired()
            self.log("x", loss, sync_dist=True)
        if f.mode == "log_dict_keys" and t.global_step == f.step and not f.done:
            f.fired()
            self.log_dict({f"metric_rank{t.global_rank}": loss.detach()}, sync_dist=True)
        if f.here(t, "extra_collective"):
            f.fired()
            torch.distributed.all_reduce(torch.ones(3))
        self.losses.append(float(loss.detach()))
        return loss


class SaveFaults(Callback):
    def __init__(self, fault: Fault) -> None:
        self.fault = fault

    def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        if self.fault.here(trainer, "save_hook_raise"):
            self.fault.fired()
            raise RuntimeError(f"{INJECTED} in on_save_checkpoint on rank {trainer.global_rank}")
        if self.fault.here(trainer, "sigkill_in_sharded_save"):
            import torch.distributed.checkpoint as dcp

            original, fault = dcp.save, self.fault

            def save_then_die(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)  # this rank's shard is on disk; the manifest is not
                fault.fired()
                os.kill(os.getpid(), signal.SIGKILL)
                return result

            dcp.save = save_then_die
        if self.fault.here(trainer, "save_enospc"):
            self.fault.fired()

            def no_space(fd: int) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            os.fsync = no_space  # the atomic writer's fsync of the temp file fails, as on a full disk


class Dump(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        torch.save({"state_dict": state, "global_step": trainer.global_step, "losses": module.losses,
                    "pid": os.getpid()}, self.out / f"rank{trainer.global_rank}.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="ddp", help="ddp, ddp_spawn, zero1/2/3, single")
    parser.add_argument("--fault", default=None)
    parser.add_argument("--max-epochs", type=int, default=2)
    parser.add_argument("--pg-timeout", type=float, default=None)
    parser.add_argument("--ckpt-every", type=int, default=0, help="ModelCheckpoint every N steps (0: none)")
    parser.add_argument("--resume", action="store_true", help='fit(ckpt_path="last")')
    parser.add_argument("--terminate-on-nan", action="store_true")
    parser.add_argument("--sharded", action="store_true", help="zero2/3: sharded checkpoint folders")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "pids.txt", "a") as f:
        f.write(f"{os.getpid()}\n")

    torch.set_num_threads(1)
    seed_everything(1234)
    fault = Fault(args.fault, out)
    callbacks: list[Callback] = [Dump(out), SaveFaults(fault)]
    if args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=args.ckpt_every, save_top_k=-1))
    strategy: Any = args.strategy
    if args.pg_timeout and args.strategy in ("ddp", "ddp_spawn"):
        strategy = DDPStrategy(timeout=args.pg_timeout, start_method="spawn" if args.strategy == "ddp_spawn"
                               else "subprocess")
    elif args.strategy.startswith("zero") and (args.pg_timeout or args.sharded):
        strategy = ZeroStrategy(stage=int(args.strategy[-1]), timeout=args.pg_timeout,
                                sharded_checkpoint=args.sharded)
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=args.max_epochs, logger=False,
        enable_checkpointing=bool(args.ckpt_every), enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, default_root_dir=out, terminate_on_nan=args.terminate_on_nan,
    )
    trainer.fit(FaultyModel(fault), ckpt_path="last" if args.resume else None)


if __name__ == "__main__":
    main()
