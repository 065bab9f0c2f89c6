"""`run_distributed(fn, *args, world_size=2)`: run `fn(rank, *args)` in forked CPU ranks with gloo.

Each child looks like a torchrun rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so a
Trainer inside it joins the world instead of launching. Forking is fast (no re-import of torch);
the child sets torch to one thread first, because a forked child can hang in the parent's thread pool.
A pytest process that used CUDA (the GPU tests ran first) starts its ranks with spawn instead: autograd's device
threads and the CUDA context do not survive a fork (the ranks' backward raises "Unable to handle autograd's
threading in combination with fork-based multiprocessing").
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from strategies.comm.distributed import find_free_port


def _child(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    torch.set_num_threads(1)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1"})
    try:
        result = fn(rank, *args)
        queue.put((rank, "ok", pickle.dumps(result)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 60) -> list[Any]:
    """Return [fn(0, *args), fn(1, *args), ...] computed on forked ranks; re-raise a rank's error."""
    ctx = multiprocessing.get_context("spawn" if torch.cuda.is_initialized() else "fork")
    queue = ctx.Queue()
    port = find_free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, fn, args, queue), daemon=True)
             for r in range(world_size)]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{payload}")
            results[rank] = pickle.loads(payload)
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [results[r] for r in range(world_size)]
