"""Ending a process's distributed state deliberately, so that a finished run exits 0 on every rank.

Why (measured on torch 2.14.1, CPU, gloo): after a collective's future is set, the gloo worker thread that ran it
still holds the work, and with it the tensors, until it loops back for the next work. Dropping those references
touches the tensors' Python objects, which needs the GIL. If the main thread reaches interpreter finalization
first, Python kills the worker thread as it asks for the GIL (`PyThread_exit_thread`), the forced unwind meets a
`noexcept` frame in `ProcessGroupGloo::runLoop`, and the process dies of `terminate called without an active
exception` (SIGABRT). A backtrace of the abort shows exactly that path
(`runLoop` → `TensorImpl::decref_pyobject` → `PyEval_RestoreThread` → `pthread_exit`). It is a race against a
descheduled worker thread, so it shows up on loaded machines (CI), one run in 10-50.

The process group cannot simply be freed before finalization (which would join the worker threads): once
torch._dynamo is imported (DDP's constructor does it) it keeps references to the default group. So at exit,
while the interpreter is still whole, `shutdown_distributed` destroys every group and then waits until the
gloo worker threads are idle (asleep in the futex wait for their next work, and not woken since the last look,
across sleeps that hand the GIL over), so no worker is left that would need the GIL during finalization. Processes
that only run our code (the ranks of `ddp_spawn`) skip finalization altogether with `os._exit(0)` after an orderly
end (see launchers.py).
"""

from __future__ import annotations

import atexit
import os
import platform
import time

import torch.distributed as dist

# torch names the threads that run gloo collectives (c10::setThreadName); with another name nothing is awaited.
_WORKER_THREAD_NAMES = ("pt_gloo_runloop",)
_FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}.get(platform.machine())  # the futex call's number on this machine
_POLL_S = 0.002
DRAIN_TIMEOUT_S = 10.0


def _worker_threads() -> list[str]:
    task_dir = "/proc/self/task"
    if not os.path.isdir(task_dir):  # not Linux: nothing to look at
        return []
    found = []
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                if f.read().strip() in _WORKER_THREAD_NAMES:
                    found.append(tid)
        except OSError:
            continue
    return found


def _in_futex_wait(tid: str) -> bool:
    """Is the thread blocked in a futex wait, where an idle worker waits for its next work? A worker that sleeps in
    any other call (a descheduled one, or a test's amplifier) may still hold finished work. Where the call cannot be
    read (another architecture, a restricted /proc) this says True and the other conditions decide alone."""
    if _FUTEX_SYSCALL is None:
        return True
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            return f.read().split(maxsplit=1)[0] == str(_FUTEX_SYSCALL)  # "running" when not in a call
    except (OSError, IndexError):
        return True


def _thread_state(tid: str) -> tuple[str, int, bool] | None:
    """(scheduler state letter, context switches so far, blocked in a futex wait) of one of this process's threads."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        switches = 0
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if "ctxt_switches" in line:  # voluntary_ctxt_switches and nonvoluntary_ctxt_switches
                    switches += int(line.split(":")[1])
        return state, switches, state == "S" and _in_futex_wait(tid)
    except (OSError, IndexError, ValueError):
        return None  # the thread ended


def wait_for_idle_worker_threads(timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
    """Wait until every gloo worker thread sleeps in a futex wait and stayed asleep across a GIL-releasing pause.

    A worker that still has to drop a finished work is runnable (state R), waiting for the GIL, or asleep somewhere
    other than a futex; the pause hands the GIL over, which wakes a GIL waiter (its context-switch count moves), and
    an idle worker's wait for its next work is a futex wait. Returns False when the threads did not settle within
    `timeout_s` (the caller carries on: this bounds exit time).
    """
    tids = _worker_threads()
    if not tids:
        return True
    deadline = time.monotonic() + timeout_s
    previous: dict[str, tuple[str, int, bool] | None] = {}
    while time.monotonic() < deadline:
        current = {tid: _thread_state(tid) for tid in tids}
        settled = all(s is None or (s[2] and previous.get(tid) == s) for tid, s in current.items())
        if settled and previous:
            return True
        previous = current
        time.sleep(_POLL_S)  # releases the GIL: a worker waiting for it gets it now
    return False


_registered = False


def shutdown_at_exit() -> None:
    """Run `shutdown_distributed` when the interpreter exits (once per process, whoever asks first)."""
    global _registered
    if not _registered:
        atexit.register(shutdown_distributed)
        _registered = True


def shutdown_distributed() -> None:
    """Destroy every process group this process has (the default one and the groups made from it), then wait
    for the collective worker threads to go idle. Runs at interpreter exit (registered by the strategy that
    created the group); no collective is issued, so it is safe after a peer failed."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError):  # already torn down by the user or by torch
            pass
    wait_for_idle_worker_threads()
