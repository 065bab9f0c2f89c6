"""The exit guard's idle check on real threads that carry the gloo worker's name (no process group needed)."""

from __future__ import annotations

import ctypes
import platform
import sys
import threading
import time

import pytest

from strategies.launch.shutdown import wait_for_idle_worker_threads

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
    reason="reads /proc/<tid>/syscall, whose futex number is known for these machines")

_PR_SET_NAME = 15


def _named_thread(body, ready: threading.Event) -> threading.Thread:
    """A thread that names itself as gloo names its workers, then runs `body`."""
    def run() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, b"pt_gloo_runloop", 0, 0, 0)
        ready.set()
        body()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    return thread


@pytest.mark.timeout(30)
def test_a_worker_asleep_outside_a_futex_wait_is_not_taken_as_idle():
    """A worker asleep while it still holds finished work (as the exit-race amplifier makes it) must be waited for:
    asleep and unmoved across a GIL hand-over is not enough."""
    started = time.monotonic()
    worker = _named_thread(lambda: time.sleep(0.5), threading.Event())
    assert wait_for_idle_worker_threads(timeout_s=10)
    assert time.monotonic() - started >= 0.5  # it waited until the sleep was over (then the thread ended)
    worker.join()


@pytest.mark.timeout(30)
def test_a_worker_waiting_for_its_next_work_is_idle_at_once():
    stop = threading.Event()
    worker = _named_thread(lambda: stop.wait(60), threading.Event())
    time.sleep(0.05)  # let it reach its wait
    started = time.monotonic()
    try:
        assert wait_for_idle_worker_threads(timeout_s=10)
        assert time.monotonic() - started < 5  # idle well before the bound (the bound would return False)
    finally:
        stop.set()
        worker.join()
