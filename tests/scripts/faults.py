"""A tiny seeded run with one injected fault, for the fault-injection tests (tests/reliability). Test-only.

    python tests/scripts/faults.py --out OUT --fault raise@1:3                     # our own launcher, 2 ranks
    torchrun --standalone --nproc_per_node 2 tests/scripts/faults.py --out OUT --fault sigterm@1:2

`--fault MODE@RANK:STEP` fires on that global rank at that global step (RANK may be `all`); give `--fault` several
times for several faults. Modes: raise, sigkill, sigterm, sigusr1, sigstop, hang, exit0 (sys.exit(0)), os_exit0,
ctrl_c (SIGINT to the launching process group, as a terminal's Ctrl-C), sigkill_parent (SIGKILL to this rank's
parent: the ddp_spawn launcher), nan_loss, return_none (a training_step whose code returns None), return_none_hidden
(None through a function outside the module), sync_dist_one_rank, log_dict_keys, extra_collective (all in
training_step), save_hook_raise (in on_save_checkpoint), save_enospc (fsync fails while saving),
sigkill_in_sharded_save (after this rank's DCP shard is written, before the manifest; with --sharded, and in
the background writer with --async-save), sigkill_before_shard_write (in DCP's save, before this rank writes), and
raise_once (raise unless OUT/fired exists; creates it: a one-time fault for torchrun --max-restarts).

Every process appends its pid to OUT/pids.txt. Each rank that finishes fit writes OUT/rank<r>.pt (final weights,
global step, per-step losses). OUT/fired_at.txt gets the wall-clock time of the (last) fault. Every rank prints
`TEARDOWN <rank>` in the teardown hook and `AFTER_FIT <rank>` when fit() returned.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from callbacks import Callback, ModelCheckpoint  # noqa: E402
from strategies import DDPStrategy, ModelParallelStrategy, ZeroStrategy  # noqa: E402
from tests.helpers.boring import BoringModel  # noqa: E402
from trainer import Trainer, seed_everything  # noqa: E402

INJECTED = "INJECTED FAILURE"
_PIDS_WRITTEN: set[int] = set()


class Fault:
    def __init__(self, specs: list[str] | None, out: Path) -> None:
        self.out = out
        self.faults: list[list[Any]] = []  # [mode, rank, step, done]; a fault fires once per process
        for spec in specs or []:
            mode, where = spec.split("@")
            rank, step = where.split(":")
            self.faults.append([mode, -1 if rank == "all" else int(rank), int(step), False])
        self.mode = self.faults[0][0] if self.faults else ""
        self._current: list[Any] | None = None

    @property
    def done(self) -> bool:
        return all(f[3] for f in self.faults)

    def here(self, trainer: Any, *modes: str) -> bool:
        for fault in self.faults:
            mode, rank, step, done = fault
            if (mode in modes and trainer.global_step == step and not done
                    and rank in (-1, trainer.global_rank)):
                self._current = fault
                self.mode = mode
                return True
        return False

    def fired(self) -> None:
        if self._current is not None:
            self._current[3] = True
        # Written whole or not at all: with faults on both ranks, the other rank may be killed (its launcher died)
        # between opening the file and writing it, and an in-place write then left it empty for the test to read.
        partial = self.out / f"fired_at.{os.getpid()}.tmp"
        partial.write_text(repr(time.time()))
        os.replace(partial, self.out / "fired_at.txt")


def _hidden_none(fault: Fault, trainer: Any, loss: torch.Tensor) -> torch.Tensor | None:
    """`return_none_hidden`: None from a function outside the module, which the step's reading does not follow."""
    if fault.here(trainer, "return_none_hidden"):
        fault.fired()
        return None
    return loss


class FaultyModel(BoringModel):
    """BoringModel whose training_step misbehaves as told, and records its losses."""

    def __init__(self, fault: Fault, step_sleep: float = 0.0) -> None:
        super().__init__()
        self.fault = fault
        self.step_sleep = step_sleep
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self._process_fault()
        if self.step_sleep:
            time.sleep(self.step_sleep)  # a slower step, for the hang bound that follows the step time
        loss = _hidden_none(self.fault, self.trainer, self._step_fault(self.layer(batch).sum()))
        if loss is not None:
            self.losses.append(float(loss.detach()))
        return loss

    def _process_fault(self) -> None:
        """Faults that end, stop or signal a process before the step: raise, signals, exits, Ctrl-C, parent kill."""
        f, t = self.fault, self.trainer
        if f.here(t, "raise") or (f.here(t, "raise_once") and not (f.out / "fired").exists()):
            (f.out / "fired").touch()
            f.fired()
            raise RuntimeError(f"{INJECTED} on rank {t.global_rank} at step {t.global_step}")
        if f.here(t, "sigkill", "sigterm", "sigusr1", "sigstop", "hang"):
            f.fired()
            if f.mode == "hang":
                time.sleep(3600)
            os.kill(os.getpid(), {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigstop": signal.SIGSTOP,
                                  "sigusr1": signal.SIGUSR1}[f.mode])
        if f.here(t, "exit0", "os_exit0"):
            f.fired()
            if f.mode == "os_exit0":
                os._exit(0)
            sys.exit(0)
        if f.here(t, "ctrl_c"):
            f.fired()
            # A terminal's Ctrl-C reaches the foreground process group; torchrun's workers run in sessions of
            # their own, so there it reaches the agent (this worker's parent), which forwards it.
            under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
            os.killpg(os.getpgid(os.getppid() if under_torchrun else 0), signal.SIGINT)
        if f.here(t, "sigkill_parent"):
            f.fired()
            os.kill(os.getppid(), signal.SIGKILL)

    def _step_fault(self, loss: torch.Tensor) -> torch.Tensor:
        """Faults in what the step gives back or does collectively: NaN, None, logging or a collective on one rank."""
        f, t = self.fault, self.trainer
        if f.here(t, "nan_loss"):
            f.fired()
            loss = loss * float("nan")
        if f.here(t, "sync_dist_one_rank"):
            f.fired()
            self.log("x", loss, sync_dist=True)
        if f.here(t, "log_dict_keys"):
            f.fired()
            self.log_dict({f"metric_rank{t.global_rank}": loss.detach()}, sync_dist=True)
        if f.here(t, "extra_collective"):
            f.fired()
            torch.distributed.all_reduce(torch.ones(3))
        return loss


class SkippingModel(FaultyModel):
    """FaultyModel whose training_step can return None (`return_none`): its code says so, so every step gets the
    synchronous agreement (trainer/ranks/step_returns.py); FaultyModel's steps get the overlapped one."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fault.here(self.trainer, "return_none"):
            self.fault.fired()
            return None
        return super().training_step(batch, batch_idx)


class MeshModel(FaultyModel):
    """FaultyModel for `--strategy model_parallel`: its layer is split over the tensor-parallel ranks."""

    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        from torch.distributed.tensor.placement_types import Replicate

        if not hasattr(self.layer.weight, "device_mesh"):  # once: fit runs configure_model every time
            parallelize_module(self.layer, self.device_mesh["tensor_parallel"],
                               ColwiseParallel(output_layouts=Replicate()))


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
        if self.fault.here(trainer, "sigkill_before_shard_write"):
            import torch.distributed.checkpoint as dcp

            fault = self.fault

            def die(*args: Any, **kwargs: Any) -> Any:
                fault.fired()  # this rank's shard is never written: the other ranks' DCP save fails
                os.kill(os.getpid(), signal.SIGKILL)

            dcp.save = die
        if self.fault.here(trainer, "save_enospc"):
            self.fault.fired()

            def no_space(fd: int) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            os.fsync = no_space  # the atomic writer's fsync of the temp file fails, as on a full disk


class TimeoutLog(Callback):
    """Writes OUT/timeouts<rank>.txt: how long a collective may wait, after each training batch and in each save."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def _log(self, trainer: Any, where: str) -> None:
        seconds = trainer.strategy.collective_timeout.current_seconds()
        with open(self.out / f"timeouts{trainer.global_rank}.txt", "a") as f:
            f.write(f"{where} {trainer.global_step} {seconds}\n")

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "batch")

    def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        self._log(trainer, "save")

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self._log(trainer, "validation")


class Dump(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if os.getpid() not in _PIDS_WRITTEN:  # a spawned rank never ran main(): record it too
            with open(self.out / "pids.txt", "a") as f:
                f.write(f"{os.getpid()}\n")

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        print(f"TEARDOWN {trainer.global_rank}", flush=True)

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        torch.save({"state_dict": state, "global_step": trainer.global_step, "losses": module.losses,
                    "pid": os.getpid()}, self.out / f"rank{trainer.global_rank}.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="ddp", help="ddp, ddp_spawn, zero1/2/3, model_parallel, single")
    parser.add_argument("--data-parallel", type=int, default=1, help="model_parallel: the data-parallel size")
    parser.add_argument("--fault", action="append", help="MODE@RANK:STEP; may be given several times")
    parser.add_argument("--max-epochs", type=int, default=2)
    parser.add_argument("--pg-timeout", type=float, default=None)
    parser.add_argument("--min-timeout", type=float, default=None, help="DDPStrategy(min_timeout=...)")
    parser.add_argument("--timeout-steps", type=int, default=None, help="DDPStrategy(timeout_steps=...)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep in every training_step")
    parser.add_argument("--log-timeouts", action="store_true", help="write OUT/timeouts<rank>.txt")
    parser.add_argument("--checkpoint-on-interrupt", action="store_true")
    parser.add_argument("--kill-launcher-after", type=float, default=0.0,
                        help="the process started by the test SIGKILLs itself after this many seconds")
    parser.add_argument("--rank1-startup-sleep", type=float, default=0.0,
                        help="a re-run of the script as rank 1 sleeps this long before anything else")
    parser.add_argument("--ckpt-every", type=int, default=0, help="ModelCheckpoint every N steps (0: none)")
    parser.add_argument("--resume", action="store_true", help='fit(ckpt_path="last")')
    parser.add_argument("--terminate-on-nan", action="store_true")
    parser.add_argument("--sharded", action="store_true", help="zero2/3: sharded checkpoint folders")
    parser.add_argument("--async-save", action="store_true", help='with --sharded: sharded_checkpoint="async"')
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "pids.txt", "a") as f:
        f.write(f"{os.getpid()}\n")
    _PIDS_WRITTEN.add(os.getpid())
    if args.kill_launcher_after and "RANK" not in os.environ:
        def kill_launcher() -> None:
            Fault(None, out).fired()
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(args.kill_launcher_after, kill_launcher).start()
    if args.rank1_startup_sleep and os.environ.get("RANK") == "1":
        time.sleep(args.rank1_startup_sleep)

    torch.set_num_threads(1)
    seed_everything(1234)
    fault = Fault(args.fault, out)
    callbacks: list[Callback] = [Dump(out), SaveFaults(fault)]
    if args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=args.ckpt_every, save_top_k=-1))
    if args.log_timeouts:
        callbacks.append(TimeoutLog(out))
    strategy: Any = args.strategy
    hang_rule = {k: v for k, v in (("min_timeout", args.min_timeout), ("timeout_steps", args.timeout_steps))
                 if v is not None}
    if (args.pg_timeout or hang_rule) and args.strategy in ("ddp", "ddp_spawn"):
        strategy = DDPStrategy(timeout=args.pg_timeout, start_method="spawn" if args.strategy == "ddp_spawn"
                               else "subprocess", **hang_rule)
    elif args.strategy == "model_parallel":
        strategy = ModelParallelStrategy(data_parallel_size=args.data_parallel, timeout=args.pg_timeout,
                                         save_distributed_checkpoint=args.sharded)
    elif args.strategy.startswith("zero") and (args.pg_timeout or args.sharded):
        strategy = ZeroStrategy(stage=int(args.strategy[-1]), timeout=args.pg_timeout,
                                sharded_checkpoint="async" if args.async_save else args.sharded)
    trainer = Trainer(
        accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=args.max_epochs, logger=False,
        enable_checkpointing=bool(args.ckpt_every), enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, default_root_dir=out, terminate_on_nan=args.terminate_on_nan,
        checkpoint_on_interrupt=args.checkpoint_on_interrupt,
    )
    model_class = SkippingModel if any(mode == "return_none" for mode, *_ in fault.faults) else FaultyModel
    if args.strategy == "model_parallel":
        model_class = MeshModel
    trainer.fit(model_class(fault, args.step_sleep), ckpt_path="last" if args.resume else None)
    print(f"AFTER_FIT {trainer.global_rank}", flush=True)


if __name__ == "__main__":
    main()
