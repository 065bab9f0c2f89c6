"""Starting the local ranks when no launcher (torchrun, SLURM) did: re-run the script once per
extra rank (Lightning's "ddp"), or torch.multiprocessing spawn ("ddp_spawn")."""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from strategies.distributed import find_free_port
from strategies.environment import ClusterEnvironment

_CHILD_POLL_S = 0.2
_CHILD_EXIT_GRACE_S = 60.0
# A rank that stopped on SIGTERM / SIGUSR1 saved a checkpoint together with the others and exits with
# 128 + signal (trainer/preemption.py): that is an orderly stop, not a failure to fan out.
GRACEFUL_EXIT_CODES = frozenset({128 + int(signal.SIGTERM), 128 + int(getattr(signal, "SIGUSR1", 10))})


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


class SubprocessLauncher:
    """Rank 0 stays in this process; ranks 1..N-1 re-run the same command with rank env vars.

    A watchdog thread ends the whole group when any child exits with an error, so a failure on
    one rank never leaves the others waiting in a collective.
    """

    def __init__(self, processes_per_node: int) -> None:
        self.processes_per_node = processes_per_node
        self.children: list[subprocess.Popen] = []
        self._stop_watch = threading.Event()
        self._graceful_code: int | None = None

    def launch(self, fn: Callable[..., Any], *args: Any, env: ClusterEnvironment) -> Any:
        port = env.master_port or find_free_port()
        os.environ.update(_rank_env(env, port, 0, self.processes_per_node))
        threads_env = {}
        if "OMP_NUM_THREADS" not in os.environ:  # as torchrun does: N ranks must not oversubscribe the cores
            threads_env["OMP_NUM_THREADS"] = "1"
            torch.set_num_threads(1)
        command = script_command()
        for local_rank in range(1, self.processes_per_node):
            child_env = {**os.environ, **threads_env, **_rank_env(env, port, local_rank, self.processes_per_node)}
            self.children.append(subprocess.Popen(command, env=child_env))
        watchdog = threading.Thread(target=self._watch, name="trainer-rank-watchdog", daemon=True)
        watchdog.start()
        # The children run the whole script, including any validate()/test() after fit(), so rank 0
        # does not wait for them here but when this process exits.
        atexit.register(self._wait_children)
        try:
            return fn(*args)
        except SystemExit as stop:
            self._stop_watch.set()
            if stop.code in GRACEFUL_EXIT_CODES:
                self._graceful_code = stop.code  # the others stop at the same step; atexit waits for them
            else:
                self._kill_children()
            raise
        except BaseException:
            self._stop_watch.set()
            self._kill_children()
            raise

    def _watch(self) -> None:
        while not self._stop_watch.wait(_CHILD_POLL_S):
            for rank, child in enumerate(self.children, start=1):
                code = child.poll()
                if code not in (None, 0) and code not in GRACEFUL_EXIT_CODES:
                    print(f"[trainer] local rank {rank} {_describe_exit(code)}; stopping every rank.",
                          file=sys.stderr, flush=True)
                    self._kill_children()
                    os._exit(1)  # this process is rank 0: it must not wait in a collective for a dead peer

    def _kill_children(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + 5
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
        for rank, child in enumerate(self.children, start=1):
            try:
                code = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
            if code != 0 and code != self._graceful_code:
                failed.append((rank, code))
        if failed:
            shown = "; ".join(f"local rank {rank} {_describe_exit(code)}" for rank, code in failed)
            print(f"[trainer] {shown} (after rank 0 finished)", file=sys.stderr, flush=True)
            os._exit(1)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _spawn_entry(local_rank: int, payload: bytes, env_vars: list[dict[str, str]], queue: Any) -> None:
    os.environ.update(env_vars[local_rank])
    fn, args = pickle.loads(payload)
    try:
        result = fn(*args)  # the run ends with a barrier: every rank is past its last collective here
    except SystemExit as stop:
        if stop.code in GRACEFUL_EXIT_CODES:  # stopped on a signal after saving, together with the others
            _exit_now(int(stop.code))
        raise
    if local_rank == 0:
        # Plain pickle bytes: tensors travel by value, so nothing depends on this process staying alive.
        queue.put(pickle.dumps(result))
    _exit_now(0)


def _exit_now(code: int) -> None:
    """End a spawned rank that finished in order without interpreter finalization, which a gloo worker thread can
    turn into SIGABRT after a successful run (see strategies/shutdown.py). It only ever ran our function."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class SpawnLauncher:
    """Start every local rank with torch.multiprocessing (spawn); rank 0's return value comes back.

    Everything passed to the ranks is pickled, so the model, callbacks and data must be picklable
    (defined at module level). The return value travels back as pickle bytes from our own rank 0.
    """

    def __init__(self, processes_per_node: int, start_method: str = "spawn") -> None:
        self.processes_per_node = processes_per_node
        self.start_method = start_method

    def launch(self, fn: Callable[..., Any], *args: Any, env: ClusterEnvironment) -> Any:
        port = env.master_port or find_free_port()
        env_vars = [_rank_env(env, port, r, self.processes_per_node) for r in range(self.processes_per_node)]
        if "OMP_NUM_THREADS" not in os.environ:
            for item in env_vars:
                item["OMP_NUM_THREADS"] = "1"
        queue = mp.get_context(self.start_method).SimpleQueue()
        # Plain pickle bytes, not torch's shared-memory reductions: each rank must get its own copy of
        # the parameters, or every rank's optimizer step would land on the same memory.
        payload = pickle.dumps((fn, args))
        context = mp.start_processes(_spawn_entry, args=(payload, env_vars, queue),
                                     nprocs=self.processes_per_node, start_method=self.start_method, join=False)
        data = None
        while True:  # drain the queue while waiting, or a large result would block rank 0's exit
            if data is None and not queue.empty():
                data = queue.get()
            if context.join(timeout=0.1):  # raises (and stops the others) when a rank failed
                break
        if data is None and not queue.empty():
            data = queue.get()
        return None if data is None else pickle.loads(data)
