"""Graceful stop on SIGTERM (and on SIGUSR1 under SLURM, which then requeues the job).

The signal handler only records the signal: no I/O, no collective, no allocation worth the name
(design rule 1 of docs/reliability.md). The ranks learn of it through the step agreement
(trainer/control.py), stop together after the same batch, save one checkpoint together, and exit
with 128 + the signal number (143 for SIGTERM), so that a restart with ckpt_path="last" resumes exactly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from strategies.filesystem import AnyPath, join, to_path

if TYPE_CHECKING:
    from trainer.trainer import Trainer

STOP_CHECKPOINT_NAME = "last.ckpt"


class StopSignals:
    """Records SIGTERM (and SIGUSR1 when running under SLURM) while fit() runs."""

    def __init__(self) -> None:
        self.received = 0  # the last signal number received; 0 = none
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        self.received = 0
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only; a fit() elsewhere cannot catch them
        wanted = [signal.SIGTERM] + ([signal.SIGUSR1] if os.environ.get("SLURM_JOB_ID") else [])
        for sig in wanted:
            self._previous[sig] = signal.signal(sig, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def stop_checkpoint_path(trainer: Trainer) -> AnyPath:
    """Where the stop checkpoint goes: beside the run's other checkpoints, found again by ckpt_path="last"."""
    cb = trainer.checkpoint_callback
    if cb is not None and cb.dirpath is not None:
        return join(cb.dirpath, STOP_CHECKPOINT_NAME)
    return join(to_path(trainer.default_root_dir), "checkpoints", STOP_CHECKPOINT_NAME)


def stop_and_exit(trainer: Trainer, signum: int) -> NoReturn:
    """Called on every rank at the same step boundary: save together, requeue under SLURM, exit."""
    path = stop_checkpoint_path(trainer)
    trainer.save_checkpoint(path)  # collective: every rank is here, after the same batch
    if trainer.checkpoint_callback is not None:
        trainer.checkpoint_callback.last_model_path = str(path)
    name = signal.Signals(signum).name
    _say(f"[rank {trainer.global_rank}] {name} received: stopped after global step {trainer.global_step} "
         f"(epoch {trainer.current_epoch}) and saved {path}; resume with ckpt_path='last'.")
    if signum == getattr(signal, "SIGUSR1", None) and trainer.is_global_zero:
        requeue_slurm_job()
    raise SystemExit(128 + signum)


def requeue_slurm_job() -> None:
    """Ask SLURM to requeue this job (rank 0 only, once); the new run resumes with ckpt_path="last"."""
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID", "")
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        _say(f"[rank 0] could not run `scontrol requeue {job_id}`: {err}")
        return
    outcome = "requeued" if result.returncode == 0 else f"requeue failed ({result.stderr.strip()})"
    _say(f"[rank 0] SLURM job {job_id} {outcome}.")


def _say(message: str) -> None:
    """One write per line, so that lines from several ranks sharing a terminal do not interleave."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
