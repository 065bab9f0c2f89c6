"""strategies/launch/parent_death.py: a rank started by our launchers ends with its launcher (Linux parent-death signal,
a polling watchdog elsewhere), also when the launch happened on a thread that ended since."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from strategies.launch.parent_death import POLL_S, pdeathsig_available
from tests.helpers.launch import REPO, _alive, clean_env

pytestmark = [pytest.mark.subprocess, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

# A parent that starts one sleeping child the way `how` says, writes the child's pid, then acts on `then`.
PARENT = textwrap.dedent("""
    import os, signal, subprocess, sys, threading, time
    from strategies.launch.parent_death import child_preexec, run_in_lasting_thread
    how, then, out = sys.argv[1], sys.argv[2], sys.argv[3]
    me = os.getpid()
    child_code = ("import os, sys, time; from strategies.launch.parent_death import die_with_parent; "
                  f"die_with_parent({me}, use_prctl={how != 'watchdog'}); time.sleep(60)")
    def start():
        preexec = child_preexec(me) if how in ("preexec", "thread") else None
        return subprocess.Popen([sys.executable, "-c", child_code], preexec_fn=preexec)
    if how == "thread":  # started from a thread that ends at once: the child must outlive the thread
        box = []
        worker = threading.Thread(target=lambda: box.append(run_in_lasting_thread(start)))
        worker.start(); worker.join()
        child = box[0]
    else:
        child = start()
    with open(out, "w") as f:
        f.write(str(child.pid))
    time.sleep(3)  # the child imports and arms itself
    if then == "report":
        print("alive" if child.poll() is None else "dead", flush=True)
    os.kill(me, signal.SIGKILL)
""")


def _run_parent(tmp_path: Path, how: str, then: str = "kill") -> tuple[int, str, float]:
    pid_file = tmp_path / "child.pid"
    proc = subprocess.run([sys.executable, "-c", PARENT, how, then, str(pid_file)], env=clean_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    died = time.monotonic()
    assert proc.returncode == -9, proc.stderr
    return int(pid_file.read_text()), proc.stdout, died


def _gone_within(pid: int, since: float, seconds: float) -> float:
    while _alive(pid):
        if time.monotonic() - since > seconds:
            os.kill(pid, 9)
            pytest.fail(f"child {pid} outlived its parent by more than {seconds} s")
        time.sleep(0.02)
    return time.monotonic() - since


@pytest.mark.timeout(90)
@pytest.mark.skipif(not pdeathsig_available(), reason="needs prctl(PR_SET_PDEATHSIG)")
@pytest.mark.parametrize("how", ["preexec", "arm"])
def test_a_child_dies_with_its_parent_through_the_kernel(tmp_path: Path, how: str):
    child, _, died = _run_parent(tmp_path, how)
    assert _gone_within(child, died, 1.0) < 1.0


@pytest.mark.timeout(90)
def test_the_watchdog_ends_a_child_without_prctl(tmp_path: Path):
    child, _, died = _run_parent(tmp_path, "watchdog")
    assert _gone_within(child, died, POLL_S + 2.0) < POLL_S + 2.0


@pytest.mark.timeout(90)
@pytest.mark.skipif(not pdeathsig_available(), reason="needs prctl(PR_SET_PDEATHSIG)")
def test_a_child_started_from_a_finished_thread_lives_until_the_process_dies(tmp_path: Path):
    """PR_SET_PDEATHSIG fires when the parent *thread* ends: children are started from a thread that lasts."""
    child, stdout, died = _run_parent(tmp_path, "thread", then="report")
    assert stdout.strip() == "alive", "the child died with the thread that started it"
    assert _gone_within(child, died, 1.0) < 1.0


@pytest.mark.timeout(60)
def test_a_rank_whose_launcher_is_already_gone_ends_at_once(tmp_path: Path):
    code = "from strategies.launch.parent_death import die_with_parent; die_with_parent(1); print('survived')"
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9 and "survived" not in proc.stdout
