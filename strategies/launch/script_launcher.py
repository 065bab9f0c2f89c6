"""Starting the local ranks when no launcher (torchrun, SLURM) did: re-run the script once per extra rank
(Lightning's "ddp", here) or torch.multiprocessing spawn ("ddp_spawn", strategies/launch/spawn_launcher.py)."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from strategies.comm.distributed import find_free_port
from strategies.launch.environment import ClusterEnvironment
from strategies.launch.parent_death import LAUNCHER_PID_VAR, child_preexec, run_in_lasting_thread

_CHILD_EXIT_GRACE_S = 60.0  # at exit, how long rank 0 waits for the other ranks to finish the script
_KILL_GRACE_S = 5.0  # SIGTERM -> SIGKILL when the ranks are stopped after a failure
_MAIN_GRACE_S = 5.0  # after a rank failed: how long rank 0's own run may take to end before this process exits
# A rank that stopped on SIGTERM / SIGUSR1 / Ctrl-C (after saving together with the others, where asked) exits with
# 128 + signal (trainer/ranks/preemption.py): an orderly stop, not a failure to fan out.
GRACEFUL_EXIT_CODES = frozenset({128 + int(signal.SIGTERM), 128 + int(getattr(signal, "SIGUSR1", 10)),
                                 128 + int(signal.SIGINT)})


def _rank_env(env: ClusterEnvironment, port: int, local_rank: int, per_node: int) -> dict[str, str]:
    """The torchrun-style variables one local rank needs to join the world."""
    return {
        "MASTER_ADDR": env.master_addr, "MASTER_PORT": str(port), "WORLD_SIZE": str(env.world_size),
        "NODE_RANK": str(env.node_rank), "GROUP_RANK": str(env.node_rank), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(per_node), "RANK": str(env.node_rank * per_node + local_rank),
    }


def script_command() -> list[str]:
    """The command that started this process, to run it again for another rank (`python -m` aware)."""
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name:
        name = spec.name.removesuffix(".__main__")
        return [sys.executable, "-m", name, *sys.argv[1:]]
    return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]


def describe_exit(code: int) -> str:
    """'exited with code 3' / 'was killed by SIGKILL'."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def say(message: str) -> None:
    """One write per line, so that lines of several processes sharing a terminal do not interleave."""
    sys.stderr.write(f"[trainer] {message}\n")
    sys.stderr.flush()


class SubprocessLauncher:
    """Rank 0 stays in this process; ranks 1..N-1 re-run the same command with rank env vars.

    One thread per child waits for it (so an exit is seen at once) and, when a child fails, reports it first (before
    the errors the other ranks then hit in their collectives), ends every rank, and gives rank 0's own run a few
    seconds to end before this process exits. The children die with this process (strategies/launch/parent_death.py).
    """

    def __init__(self, processes_per_node: int) -> None:
        self.processes_per_node = processes_per_node
        self.children: list[subprocess.Popen] = []
        self.child_ranks: list[int] = []  # the global rank of each child
        self._stop_watch = threading.Event()  # rank 0's own run has ended (it stops the children itself)
        self._graceful_code: int | None = None
        self._lock = threading.Lock()
        self._codes: dict[int, tuple[int, bool]] = {}  # local rank -> (exit code, ended by this launcher)
        self._reported: set[int] = set()
        self._ended_by_us: set[int] = set()
        self._ending = False
        self._exit_seen = threading.Event()

    def launch(self, fn: Callable[..., Any], *args: Any, env: ClusterEnvironment) -> Any:
        port = env.master_port or find_free_port()
        os.environ.update(_rank_env(env, port, 0, self.processes_per_node))
        threads_env = {}
        if "OMP_NUM_THREADS" not in os.environ:  # as torchrun does: N ranks must not oversubscribe the cores
            threads_env["OMP_NUM_THREADS"] = "1"
            torch.set_num_threads(1)
        command, me = script_command(), os.getpid()

        def start() -> None:
            for local_rank in range(1, self.processes_per_node):
                rank_env = _rank_env(env, port, local_rank, self.processes_per_node)
                child_env = {**os.environ, **threads_env, **rank_env, LAUNCHER_PID_VAR: str(me)}
                self.children.append(subprocess.Popen(command, env=child_env, preexec_fn=child_preexec(me)))
                self.child_ranks.append(int(rank_env["RANK"]))

        run_in_lasting_thread(start)  # the kernel's parent-death signal follows the thread that forked the child
        for local_rank, child in enumerate(self.children, start=1):
            threading.Thread(target=self._watch, args=(local_rank, child), name=f"trainer-rank-{local_rank}-watch",
                             daemon=True).start()
        # The children run the whole script, including any validate()/test() after fit(), so rank 0
        # does not wait for them here but when this process exits.
        atexit.register(self._wait_children)
        try:
            return fn(*args)
        except SystemExit as stop:
            self._stop_watch.set()
            if stop.code in GRACEFUL_EXIT_CODES:
                self._graceful_code = int(stop.code)  # the others stop at the same step
            else:
                self._kill_children()
            raise
        except BaseException:
            self._stop_watch.set()
            self._kill_children()
            raise

    # --- watching the children ------------------------------------------------------------------------
    def _watch(self, local_rank: int, child: subprocess.Popen) -> None:
        code = child.wait()
        with self._lock:
            ours = self._ending or local_rank in self._ended_by_us
            self._codes[local_rank] = (code, ours)
            failed = not ours and code != 0 and code not in GRACEFUL_EXIT_CODES and not self._stop_watch.is_set()
            if failed:
                say(f"local rank {local_rank} {describe_exit(code)}; stopping every rank.")
                self._reported.add(local_rank)
        self._exit_seen.set()
        if failed:
            self._kill_children()
            if not self._stop_watch.wait(_MAIN_GRACE_S):  # rank 0's collectives fail at once: it normally ends itself
                os._exit(1)  # this process is rank 0: it must not wait in a collective for a dead peer

    def exit_report(self, wait_s: float) -> str | None:
        """For rank 0's error after a lost connection: which child ended and how (waiting up to `wait_s` for the
        exit to be seen; a failed child's line is printed by then). None when every child still runs."""
        self._exit_seen.wait(wait_s)
        with self._lock:
            ended = [(rank, code) for rank, (code, ours) in sorted(self._codes.items()) if not ours]
        if not ended:
            return None
        return "; ".join(
            f"local rank {rank} (global rank {self.child_ranks[rank - 1]}) {describe_exit(code)}"
            + (" while this rank was still training" if code == 0 else "") for rank, code in ended)

    def end_rank(self, global_rank: int) -> bool:
        """SIGKILL one of the children (a rank found hung); its exit is then not reported as a failure."""
        if global_rank not in self.child_ranks:
            return False
        local_rank = self.child_ranks.index(global_rank) + 1
        with self._lock:
            self._ended_by_us.add(local_rank)
        child = self.children[local_rank - 1]
        if child.poll() is None:
            child.kill()
        return True

    def _kill_children(self) -> None:
        with self._lock:
            self._ending = True
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + _KILL_GRACE_S
        for child in self.children:
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def _wait_children(self) -> None:
        """At exit: give the other ranks time to finish, then make a failure of theirs this process's too."""
        self._stop_watch.set()
        deadline = time.monotonic() + _CHILD_EXIT_GRACE_S
        failed = []
        for local_rank, child in enumerate(self.children, start=1):
            try:
                code = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
            with self._lock:
                ours = self._codes.get(local_rank, (code, self._ending))[1]
            if not ours and code != 0 and code != self._graceful_code and local_rank not in self._reported:
                failed.append((local_rank, code))
        if failed:
            shown = "; ".join(f"local rank {rank} {describe_exit(code)}" for rank, code in failed)
            say(f"{shown} (after rank 0 finished)")
            os._exit(1)
