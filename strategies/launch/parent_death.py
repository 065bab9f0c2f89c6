"""Ranks end with the process that launched them: no orphan keeps training (or holding a GPU) after its launcher died.

Why: our launchers (`strategy="ddp"` re-running the script, `"ddp_spawn"`) start the ranks as child processes. When
the launcher is SIGKILLed (OOM killer, `kill -9`, a crashed notebook kernel), its children are re-parented to init and
run on until their next collective fails, or forever when they wait on something else (measured before this module:
22-25 s, and unbounded for a rank busy outside collectives).

On Linux the kernel does it: `prctl(PR_SET_PDEATHSIG, SIGKILL)` in the child makes the kernel SIGKILL it when its
parent dies. Two details matter. The signal follows the death of the parent *thread* that forked the child, not of
the parent process, so children are started from a thread that lives as long as the process (`run_in_lasting_thread`).
And a parent that dies before the child's prctl leaves the child already re-parented, so the child compares its parent
pid with the launcher's right after the call. Elsewhere (no prctl), a daemon thread in the child polls its parent pid.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

LAUNCHER_PID_VAR = "TRAINER_LAUNCHER_PID"  # set by our launchers in the environment of the ranks they start
_PR_SET_PDEATHSIG = 1
POLL_S = 0.25  # the fallback watchdog's period: the rank ends within this much (plus scheduling) of its launcher


@functools.cache
def _prctl() -> Any:
    """libc's prctl, resolved once in the parent (the child between fork and exec must not load libraries); None
    where there is none. `CDLL(None)` reads the symbols already loaded: no library search, no `ldconfig` run."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def pdeathsig_available() -> bool:
    """Whether the kernel can end this process with its parent (Linux prctl)."""
    return _prctl() is not None


def _set_pdeathsig(sig: int, prctl: Any) -> bool:
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


def child_preexec(parent_pid: int) -> Callable[[], None] | None:
    """A `subprocess.Popen(preexec_fn=...)` that makes the child die with `parent_pid` from its first instruction
    on (the setting survives exec); None where prctl is not available (the child then starts `die_with_parent`)."""
    prctl = _prctl()
    if prctl is None:
        return None

    def preexec() -> None:  # runs in the forked child before exec: only the prctl call and two syscalls
        _set_pdeathsig(signal.SIGKILL, prctl)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


_armed: dict[int, str] = {}  # parent pid -> how this process already dies with it


def die_with_parent(parent_pid: int, use_prctl: bool = True) -> str:
    """End this process (SIGKILL) as soon as `parent_pid`, its launcher, is gone. Returns how: "prctl" or "watchdog".

    Called in a rank started by our launchers. With prctl the kernel does it; otherwise a daemon thread polls the
    parent pid every POLL_S seconds. Either way a launcher that is already gone ends this process at once.
    Calling it again for the same parent only re-checks the parent.
    """
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    if parent_pid in _armed:
        return _armed[parent_pid]
    _armed[parent_pid] = how = _arm(parent_pid, use_prctl)
    return how


def _arm(parent_pid: int, use_prctl: bool) -> str:
    if use_prctl and _set_pdeathsig(signal.SIGKILL, _prctl()):
        if os.getppid() != parent_pid:  # it died before the call: the kernel will not tell us any more
            os.kill(os.getpid(), signal.SIGKILL)
        return "prctl"

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="trainer-parent-watch", daemon=True).start()
    return "watchdog"


def die_with_launcher_from_env() -> str | None:
    """In a rank our launcher started (its pid is in the environment): `die_with_parent(launcher)`; else None."""
    value = os.environ.get(LAUNCHER_PID_VAR)
    if not value:
        return None
    try:
        parent = int(value)
    except ValueError:
        return None
    return die_with_parent(parent)


_lasting: dict[str, Any] = {}


def run_in_lasting_thread(fn: Callable[[], T]) -> T:
    """Run `fn` (which starts child processes) in a thread that lives until the process exits.

    The kernel's parent-death signal follows the thread that forked the child. The main thread lives as long as the
    process, so `fn` runs there directly; from any other thread (a fit() started in a worker thread, which may end
    while its children still run the rest of the script) it runs in one parked daemon thread kept for the process.
    """
    if threading.current_thread() is threading.main_thread():
        return fn()
    if "queue" not in _lasting:
        import queue

        jobs: queue.SimpleQueue = queue.SimpleQueue()

        def serve() -> None:
            while True:
                job, box, done = jobs.get()
                try:
                    box.append((True, job()))
                except BaseException as err:  # handed back to the caller
                    box.append((False, err))
                done.set()

        threading.Thread(target=serve, name="trainer-rank-parent", daemon=True).start()
        _lasting["queue"] = jobs
    box: list[tuple[bool, Any]] = []
    done = threading.Event()
    _lasting["queue"].put((fn, box, done))
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value
