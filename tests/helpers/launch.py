"""Run real multi-process launches in subprocesses with a hard wall-clock limit, and make sure nothing survives.

Each command starts in its own session; on timeout (or any other way out of the test) every process group is
terminated, then killed, along with every pid the script recorded in OUT/pids.txt or OUT/rank*.pt (torchrun starts
its workers in sessions of their own). The launch then checks that no process it started outlives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LAUNCH_TIMEOUT_S = 75.0  # one 2-rank launch takes 10-20 s on 2 busy cores; pytest-timeout is the outer bound
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
              "MASTER_PORT", "TRAIN_RANKS_FAIL", "TRAINER_LAUNCHER_PID")


def clean_env(**extra: str) -> dict[str, str]:
    """A clean child environment: no rank/cluster variables leaking in from the test process."""
    env = {k: v for k, v in os.environ.items()
           if k not in _RANK_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1")
    env.update(extra)
    return env


@dataclass
class Finished:
    returncode: int
    output: str
    seconds: float  # from the start of the launch until every process had exited
    ended_at: float  # wall clock (time.time()) when every process had exited
    all_gone_at: float = 0.0  # wall clock when no process of the launch (nor any that ran the script) was left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; it only waits for its parent (or init) to reap it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _recorded_pids(out: Path) -> list[int]:
    """Every process that ran the script (pids.txt) and every rank that finished fit (spawned ranks included)."""
    pids = set()
    marker = out / "pids.txt"
    if marker.exists():
        pids.update(int(line) for line in marker.read_text().split())
    for path in out.glob("rank*.pt"):
        try:
            pids.add(int(torch.load(path, weights_only=True)["pid"]))
        except Exception:  # a rank killed while writing: the pgroup scan and pids.txt still cover it
            pass
    return sorted(pids)


def _group_members(pgids: set[int]) -> set[int]:
    """Live processes whose process group is one of `pgids` (a /proc scan: no ps, no psutil)."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in pgids:  # fields: state, ppid, pgrp, ...
            members.add(int(entry))
    return members


def _describe(pid: int) -> str:
    """pid, its rank variables (a launched rank has them) and its command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid}: (gone)"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        rank = " ".join(f"{k}={env[k.encode()].decode()}" for k in ("RANK", "LOCAL_RANK", "NODE_RANK")
                        if k.encode() in env)
    except OSError:
        rank = ""
    return f"{pid}: [{rank or 'no rank variables'}] {command[:200]}"


def _survivors(pids: list[int], pgids: set[int] | None = None, grace_s: float = 3.0) -> list[int]:
    """The processes among `pids` and in the groups `pgids` still alive after `grace_s` (returns as soon as none is)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = sorted(({pid for pid in pids if _alive(pid)} | _group_members(pgids or set())) - {os.getpid()})
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _kill_everything(procs: list[subprocess.Popen], out: Path) -> None:
    """SIGTERM each process group (torchrun forwards it to its workers), then SIGKILL whatever is left."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    for pid in _recorded_pids(out):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    # SIGKILL is delivered asynchronously: wait until the kernel has actually ended them.
    _survivors(_recorded_pids(out), {proc.pid for proc in procs}, grace_s=5.0)


def launch(commands: list[tuple[list[str], dict[str, str]]], out: Path, timeout: float = LAUNCH_TIMEOUT_S,
           grace_s: float = 3.0) -> list[Finished]:
    """Start every command at once (each in its own session), wait for all with one deadline, and make sure that
    no process started here, nor any process that ran the script, outlives the call (by more than `grace_s`)."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for i, (cmd, env) in enumerate(commands):
            log = open(out / f"launch{i}.log", "w+")  # files, not pipes: concurrent ranks cannot block on output
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=env, cwd=out.parent, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = start + timeout
        timed_out = False
        hung_text: list[str] = []
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:  # name what was still running (each rank's command line) before anything is killed
            hung = _recorded_pids(out) + [p.pid for p in procs]
            hung_text = [_describe(pid) for pid in sorted(set(hung)) if _alive(pid)]
        seconds, ended_at = time.monotonic() - start, time.time()
        # Before any clean-up kill: a rank that outlived its launcher (e.g. a child of our own launcher, which
        # stays in the launcher's process group, or a torchrun worker, which ran the script) is a bug.
        survivors = [] if timed_out else _survivors(_recorded_pids(out), {proc.pid for proc in procs}, grace_s)
        all_gone_at = time.time()
        survivors_text = "\n".join(_describe(pid) for pid in survivors)
    except BaseException:
        for log in logs:
            log.close()
        raise
    finally:  # also on timeout, pytest-timeout's exception or Ctrl-C: never leave a process behind
        _kill_everything(procs, out)
    results = []
    for proc, log in zip(procs, logs, strict=True):
        log.seek(0)
        results.append(Finished(proc.returncode, log.read(), seconds, ended_at, all_gone_at))
        log.close()
    if timed_out:
        still = "\n".join(hung_text) or "(none left: they ended while the launch was being stopped)"
        outputs = "\n".join(report(i, r, " (killed at the deadline)" if r.returncode != 0 else "")
                            for i, r in enumerate(results))
        pytest.fail(f"launch did not finish within {timeout:.0f} s; processes killed. Still running at the "
                    f"deadline:\n{still}\n{outputs}")
    assert not survivors, f"processes still alive after the launch finished (now killed):\n{survivors_text}"
    return results


ABORT_MARKERS = ("terminate called", "SIGABRT", "Signal 6", "core dumped")


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def report(index: int, res: Finished, note: str = "", lines: int = 40) -> str:
    """One command's outcome for a failure message: how it ended, the abort line if any, its last lines (where
    every rank's `[rank N]` lines and the launcher's report of a rank's exit show which rank it was)."""
    aborts = [line for line in res.output.splitlines() if any(m in line for m in ABORT_MARKERS)]
    abort = f"\n  abort: {aborts[0].strip()}" if aborts else ""
    tail = "\n".join(res.output.splitlines()[-lines:])
    return f"--- command {index}: {describe_exit(res.returncode)}{note}{abort}\n{tail}"


def assert_ok(results: list[Finished]) -> None:
    """Every command exited 0 and printed no abort line; otherwise show how each one ended."""
    bad = [i for i, res in enumerate(results)
           if res.returncode != 0 or any(m in res.output for m in ABORT_MARKERS)]
    assert not bad, "\n".join(report(i, res) for i, res in enumerate(results))
