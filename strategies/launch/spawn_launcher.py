"""`strategy="ddp_spawn"`: every local rank is a torch.multiprocessing child of the process that called fit().

The launching process is not a rank: it forwards SIGTERM and SIGINT to the ranks (so `kill <pid>` or Ctrl-C stops
them together, as a preemption does), reports a rank killed by a signal as soon as it sees it, ends the others a few
seconds after a failure (torch's own join gives them 30 s after SIGTERM, which a hung rank ignores), and ends with the
ranks' own exit code when they stopped in order (143 after SIGTERM, 130 after Ctrl-C). The ranks die with it.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch.multiprocessing as mp

from strategies.comm.distributed import find_free_port
from strategies.launch.environment import ClusterEnvironment
from strategies.launch.global_state import GlobalState
from strategies.launch.parent_death import LAUNCHER_PID_VAR, die_with_parent
from strategies.launch.script_launcher import GRACEFUL_EXIT_CODES, _rank_env, describe_exit, say

_FAILURE_GRACE_S = 3.0  # after a rank failed, the others may report their own errors this long, then are killed
_STOP_GRACE_S = 60.0  # after a rank stopped in order (SIGTERM, Ctrl-C), the others finish the same stop


def _spawn_entry(local_rank: int, payload: bytes | list[Any], env_vars: list[dict[str, str]], queue: Any) -> None:
    os.environ.update(env_vars[local_rank])
    die_with_parent(int(env_vars[local_rank][LAUNCHER_PID_VAR]))  # torch's own parent-death signal is SIGINT
    data = payload if isinstance(payload, bytes) else _read_own_pipe(payload, local_rank)
    fn, args, state = pickle.loads(data)
    if state is not None:
        state.restore()  # the launching process's RNG and determinism flags (strategies/launch/global_state.py)
    try:
        result = fn(*args)  # the run ends with a barrier: every rank is past its last collective here
    except SystemExit as stop:
        if stop.code in GRACEFUL_EXIT_CODES:  # stopped on a signal, together with the others
            _exit_now(int(stop.code))
        raise
    if local_rank == 0:
        # Plain pickle bytes: tensors travel by value, so nothing depends on this process staying alive.
        queue.put(pickle.dumps(result))
    _exit_now(0)


def _read_own_pipe(readers: list[Any], local_rank: int) -> bytes:
    """The bytes the launcher writes to this rank's pipe once every rank has started (see _send_after_start)."""
    for index, reader in enumerate(readers):
        if index != local_rank:
            reader.close()
    with readers[local_rank] as reader:
        return reader.recv_bytes()


def _exit_now(code: int) -> None:
    """End a spawned rank that finished in order without interpreter finalization, which a gloo worker thread can
    turn into SIGABRT after a successful run (see strategies/launch/shutdown.py). It only ever ran our function."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextmanager
def _forward_signals(processes: list[Any]) -> Iterator[None]:
    """While the ranks run, SIGTERM / SIGINT sent to this process go to every rank (signals are only ever set on
    the main thread; elsewhere nothing is forwarded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        for process in processes:
            if process.exitcode is None and process.pid is not None:
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _rank_error(context: Any, index: int) -> Exception:
    """torch's exception for a failed rank: its traceback when it raised, else how it ended."""
    process = context.processes[index]
    error_file = context.error_files[index]
    if os.access(error_file, os.R_OK):
        with open(error_file, "rb") as f:
            trace = pickle.load(f)
        return mp.ProcessRaisedException(f"\n\n-- Process {index} terminated with the following error:\n{trace}",
                                         index, process.pid)
    code = process.exitcode
    name = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
    return mp.ProcessExitedException(f"process {index} {describe_exit(code)}", error_index=index,
                                     error_pid=process.pid, exit_code=code, signal_name=name)


class SpawnLauncher:
    """Start every local rank with torch.multiprocessing (spawn); rank 0's return value comes back.

    Everything passed to the ranks is pickled, so the model, callbacks and data must be picklable
    (defined at module level). The return value travels back as pickle bytes from our own rank 0. Every rank
    starts from this process's RNG states and determinism flags, as Lightning's spawned ranks do.
    """

    def __init__(self, processes_per_node: int, start_method: str = "spawn") -> None:
        self.processes_per_node = processes_per_node
        self.start_method = start_method

    def launch(self, fn: Callable[..., Any], *args: Any, env: ClusterEnvironment) -> Any:
        port = env.master_port or find_free_port()
        env_vars = [_rank_env(env, port, r, self.processes_per_node) for r in range(self.processes_per_node)]
        for item in env_vars:
            item[LAUNCHER_PID_VAR] = str(os.getpid())
            if "OMP_NUM_THREADS" not in os.environ:
                item["OMP_NUM_THREADS"] = "1"
        mp_context = mp.get_context(self.start_method)
        queue = mp_context.SimpleQueue()
        # Plain pickle bytes, not torch's shared-memory reductions: each rank must get its own copy of
        # the parameters, or every rank's optimizer step would land on the same memory.
        state = None if self.start_method == "fork" else GlobalState.capture()  # a forked rank inherits it
        payload = pickle.dumps((fn, args, state))
        pipes = None if self.start_method == "fork" else [mp_context.Pipe(duplex=False)
                                                           for _ in range(self.processes_per_node)]
        shipped = payload if pipes is None else [reader for reader, _ in pipes]
        context = mp.start_processes(_spawn_entry, args=(shipped, env_vars, queue),
                                     nprocs=self.processes_per_node, start_method=self.start_method, join=False)
        if pipes is not None:
            _send_after_start(pipes, payload)
        with _forward_signals(context.processes):
            data = self._wait(context, queue)
        return None if data is None else pickle.loads(data)

    def _wait(self, context: Any, queue: Any) -> bytes | None:
        """Wait for every rank, then return rank 0's result or raise what ended the ranks."""
        data, first = _watch(context.processes, queue)
        for process in context.processes:
            process.join()
        return _outcome(context, data, first)


def _send_after_start(pipes: list[tuple[Any, Any]], payload: bytes) -> None:
    """Give each started rank the model and trainer through its own pipe, from a thread per rank.

    Passed with the process instead, bytes beyond a pipe's buffer (64 KiB: a small model) make the start of
    each rank wait until the one before has imported torch to read them, so the ranks started one after the
    other (about 1.3 s more to the first step with 2 ranks, benchmarks/launch.py). Each rank closes the pipes
    of the others as soon as it has them, and this process closes its own copies here, so a rank that dies
    before reading leaves no reader: the write fails, and `_watch` reports how that rank ended.
    """
    for reader, writer in pipes:
        reader.close()  # the ranks hold their own copies; the parent writes only

        def send(writer: Any = writer) -> None:
            try:
                with writer:
                    writer.send_bytes(payload)
            except OSError:  # the rank ended before reading: _watch reports how it ended
                pass

        threading.Thread(target=send, name="trainer-rank-payload", daemon=True).start()


def _watch(processes: list[Any], queue: Any) -> tuple[bytes | None, int | None]:
    """Run until every rank has ended: drain rank 0's result (a large one would block its exit), and after the first
    failure give the others `_FAILURE_GRACE_S` (`_STOP_GRACE_S` after an orderly stop) to end, then kill them.

    Returns the result (None if rank 0 sent none) and the first rank seen failing (None if none failed)."""
    data, first, since = None, None, 0.0
    while True:
        if data is None and not queue.empty():
            data = queue.get()
        codes = [p.exitcode for p in processes]
        if all(code is not None for code in codes):
            break
        if first is None:
            first, since = _first_failure(codes), time.monotonic()
        elif time.monotonic() - since > (_STOP_GRACE_S if codes[first] in GRACEFUL_EXIT_CODES else _FAILURE_GRACE_S):
            for process in processes:
                if process.exitcode is None:
                    process.kill()
        alive = [p.sentinel for p in processes if p.exitcode is None]
        multiprocessing.connection.wait(alive, timeout=0.1)
    if data is None and not queue.empty():
        data = queue.get()
    return data, first


def _first_failure(codes: list[int | None]) -> int | None:
    """The first rank that ended with a non-zero code; a killed one is announced, as nobody else can say so."""
    first = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
    code = None if first is None else codes[first]
    if first is not None and code is not None and code < 0:  # a rank that raised printed its error itself
        say(f"rank {first} {describe_exit(code)}; stopping every rank.")
    return first


def _outcome(context: Any, data: bytes | None, first: int | None) -> bytes | None:
    """Rank 0's result when every rank succeeded; the common exit code when all stopped in order; else the error."""
    codes = [p.exitcode for p in context.processes]
    if all(code == 0 for code in codes):
        return data
    stopped = {code for code in codes if code != 0}
    if len(stopped) == 1 and stopped <= GRACEFUL_EXIT_CODES:
        raise SystemExit(stopped.pop())  # every rank stopped in order: this process ends as they did
    failed = [i for i, code in enumerate(codes) if code != 0]
    order = ([first] if first is not None else []) + failed
    # The first rank that raised carries the root cause (a killed rank was announced above when seen).
    index = next((i for i in order if os.access(context.error_files[i], os.R_OK)), order[0])
    raise _rank_error(context, index)
