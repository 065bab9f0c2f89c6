"""Graceful stop on SIGTERM, on Ctrl-C (SIGINT), and on SIGUSR1 under SLURM (which then requeues the job).

The signal handler only records the signal: no I/O, no collective, no allocation worth the name
(design rule 1 of docs/reliability.md). The ranks learn of it through the step agreement
(trainer/ranks/agreement.py), stop together after the same batch, save one checkpoint together (after Ctrl-C only with
`Trainer(checkpoint_on_interrupt=True)`), and exit with 128 + the signal number (143 for SIGTERM, 130 for Ctrl-C),
so that code after fit() does not run as if training had finished and a restart with ckpt_path="last" resumes
exactly. A second Ctrl-C more than a second after the first stops at once (KeyboardInterrupt, then exit 130): a
terminal delivers one Ctrl-C to every process of its group, and a launcher may forward it once more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from strategies.checkpoint_io.filesystem import AnyPath, join, to_path

if TYPE_CHECKING:
    from trainer.trainer import Trainer

STOP_CHECKPOINT_NAME = "last.ckpt"
SECOND_INTERRUPT_AFTER_S = 1.0  # a Ctrl-C this long after the first one stops at once


class Interrupted(KeyboardInterrupt):
    """Every rank stopped after the same batch on Ctrl-C; callbacks' on_exception see a KeyboardInterrupt, then the
    process exits with 130."""


class SIGTERMException(SystemExit):
    """Every rank stopped after the same batch on SIGTERM and saved a checkpoint; the process exits with 143.

    A SystemExit, as Lightning's: callbacks' `on_exception` see it, and `except SIGTERMException` around fit() can
    do a last thing before the process ends."""


class StopSignals:
    """Records SIGTERM, SIGINT (when Python's default Ctrl-C handler is in place) and SIGUSR1 (under SLURM) while
    fit() runs."""

    def __init__(self) -> None:
        self.received = 0  # the signal to stop on; SIGTERM / SIGUSR1 take precedence over SIGINT; 0 = none
        self._previous: dict[int, Any] = {}
        self._first_interrupt: float | None = None

    def install(self) -> None:
        self.received, self._first_interrupt = 0, None
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only; a fit() elsewhere cannot catch them
        wanted = [signal.SIGTERM] + ([signal.SIGUSR1] if os.environ.get("SLURM_JOB_ID") else [])
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # a handler of the user's stays theirs
            wanted.append(signal.SIGINT)
        for sig in wanted:
            self._previous[sig] = signal.signal(sig, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._first_interrupt is None:
                self._first_interrupt = now
            elif now - self._first_interrupt > SECOND_INTERRUPT_AFTER_S:
                raise KeyboardInterrupt  # a second Ctrl-C: stop at once, as Python would
            if self.received:
                return  # a SIGTERM stop (which saves) is already on its way
        self.received = signum

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def stop_checkpoint_path(trainer: Trainer) -> AnyPath:
    """Where the stop checkpoint goes: beside the run's other checkpoints, found again by ckpt_path="last"."""
    cb = trainer.checkpoint_callback
    if cb is not None and cb.dirpath is not None:
        return join(to_path(cb.dirpath), STOP_CHECKPOINT_NAME)
    return join(to_path(trainer.default_root_dir), "checkpoints", STOP_CHECKPOINT_NAME)


def stop_and_exit(trainer: Trainer, signum: int) -> NoReturn:
    """Called on every rank at the same step boundary: save together, requeue under SLURM, exit."""
    interrupted = signum == signal.SIGINT
    name = "SIGINT (Ctrl-C)" if interrupted else signal.Signals(signum).name
    stopped = (f"[rank {trainer.global_rank}] {name} received: stopped after global step {trainer.global_step} "
               f"(epoch {trainer.current_epoch})")
    if interrupted and not trainer.checkpoint_on_interrupt:
        _say(f"{stopped}; no checkpoint saved (Trainer(checkpoint_on_interrupt=True) saves one).")
        raise Interrupted(f"{name} received")
    path = stop_checkpoint_path(trainer)
    trainer.save_checkpoint(path)  # collective: every rank is here, after the same batch
    if trainer.checkpoint_callback is not None:
        trainer.checkpoint_callback.last_model_path = str(path)
    _say(f"{stopped} and saved {path}; resume with ckpt_path='last'.")
    if signum == getattr(signal, "SIGUSR1", None) and trainer.is_global_zero:
        requeue_slurm_job()
    if interrupted:
        raise Interrupted(f"{name} received")
    raise (SIGTERMException if signum == signal.SIGTERM else SystemExit)(128 + signum)


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
