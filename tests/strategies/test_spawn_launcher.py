"""ddp_spawn's launcher hands every rank the pickled trainer and model through its own pipe once all ranks have
started. Passed with the process object instead, bytes beyond a pipe's buffer made each rank's start wait until the
rank before it had imported torch (benchmarks/launch.py measured the serial start: about 1.3 s with 2 ranks)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from strategies.launch import spawn_launcher
from strategies.launch.environment import ClusterEnvironment
from strategies.launch.spawn_launcher import SpawnLauncher


def _check_blob(blob: bytes, digest: str) -> tuple[int, int]:
    """Runs in each rank: the bytes arrived whole, or this rank fails the launch."""
    if hashlib.sha256(blob).hexdigest() != digest:
        raise AssertionError(f"rank {os.environ['LOCAL_RANK']} got {len(blob)} bytes that differ from the parent's")
    return int(os.environ["LOCAL_RANK"]), len(blob)


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_a_payload_larger_than_a_pipe_reaches_every_rank_after_they_all_started(monkeypatch: Any):
    blob = os.urandom(4 * 2**20)
    shipped: list[Any] = []
    start = spawn_launcher.mp.start_processes

    def recording(fn: Any, args: tuple, **kwargs: Any) -> Any:
        shipped.append(args[0])
        return start(fn, args, **kwargs)

    monkeypatch.setattr(spawn_launcher.mp, "start_processes", recording)
    env = ClusterEnvironment(kind="local", external=False, world_size=2, global_rank=0, local_rank=0, node_rank=0,
                             master_addr="127.0.0.1", master_port=None)
    result = SpawnLauncher(2).launch(_check_blob, blob, hashlib.sha256(blob).hexdigest(), env=env)
    assert result == (0, len(blob))
    (given,) = shipped
    assert isinstance(given, list) and len(given) == 2, "the payload travelled with the process objects"


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_a_rank_killed_before_it_reads_its_payload_fails_the_launch_without_a_hang(monkeypatch: Any):
    blob = os.urandom(1 * 2**20)
    start = spawn_launcher.mp.start_processes

    def kill_rank_1_at_once(fn: Any, args: tuple, **kwargs: Any) -> Any:
        context = start(fn, args, **kwargs)
        context.processes[1].kill()  # before the launcher writes anything to its pipe
        return context

    monkeypatch.setattr(spawn_launcher.mp, "start_processes", kill_rank_1_at_once)
    env = ClusterEnvironment(kind="local", external=False, world_size=2, global_rank=0, local_rank=0, node_rank=0,
                             master_addr="127.0.0.1", master_port=None)
    with pytest.raises(spawn_launcher.mp.ProcessExitedException, match="process 1") as failed:
        SpawnLauncher(2).launch(_check_blob, blob, hashlib.sha256(blob).hexdigest(), env=env)
    assert failed.value.signal_name == "SIGKILL"


def _draws() -> tuple[list[float], float, float]:
    import random

    import numpy as np
    import torch

    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def _draw_as_expected(expected: tuple[list[float], float, float], deterministic: bool) -> tuple[list[float], float,
                                                                                                   float]:
    """Runs in each rank: it starts from the launching process's random state and determinism flag."""
    import torch

    got = _draws()
    if got != expected or torch.are_deterministic_algorithms_enabled() != deterministic:
        raise AssertionError(f"rank {os.environ['LOCAL_RANK']} drew {got}, the launching process would draw {expected}")
    return got


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_spawned_ranks_start_from_the_launching_process_random_state():
    """Lightning's spawn launcher carries the RNG states into the ranks: `torch.manual_seed(0)` before `fit` makes
    every rank draw the same numbers, run after run (a fresh interpreter otherwise draws from a fresh seed)."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(0)
    random.seed(1)
    np.random.seed(2)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    expected = _draws()
    torch.set_rng_state(before[0])
    random.setstate(before[1])
    np.random.set_state(before[2])
    env = ClusterEnvironment(kind="local", external=False, world_size=2, global_rank=0, local_rank=0, node_rank=0,
                             master_addr="127.0.0.1", master_port=None)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert SpawnLauncher(2).launch(_draw_as_expected, expected, True, env=env) == expected
    finally:
        torch.use_deterministic_algorithms(False)
