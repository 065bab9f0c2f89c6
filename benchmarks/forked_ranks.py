"""Ranks forked from the benchmark process (as tests/helpers/dist.py does), for the benchmarks that measure one fit
on a few ranks: each rank runs `work(rank)` with the torch.distributed environment set, and its result (or its
traceback) comes back through a queue; every rank is joined or killed before the call returns."""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from strategies.comm.distributed import find_free_port


def _child(rank: int, world_size: int, port: int, work: Callable[[int], Any], queue: Any) -> None:
    torch.set_num_threads(1)  # before any torch op: a forked child can hang in the parent's thread pool
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1"})
    try:
        queue.put((rank, "ok", work(rank)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_forked(work: Callable[[int], Any], label: str, world_size: int, timeout: float,
               join_timeout: float = 10) -> list[Any]:
    """`work(rank)` on `world_size` freshly forked ranks; their results, by rank. A failing rank raises here with
    its traceback, naming `label`."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    port = find_free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, work, queue), daemon=True)
             for r in range(world_size)]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "error":
                raise RuntimeError(f"{label}: rank {rank} failed:\n{payload}")
            results[rank] = payload
    finally:
        for proc in procs:
            proc.join(timeout=join_timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [results[r] for r in range(world_size)]
