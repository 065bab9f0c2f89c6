"""Test hygiene: every test runs in its own temp dir, with env vars, rank-zero state, determinism
and torch threads restored afterwards, so tests cannot leak into each other or the repo tree."""

from __future__ import annotations

import os

import pytest
import torch

from strategies.distributed import rank_zero_only


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Trainer's default_root_dir is the cwd
    env = dict(os.environ)
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    os.environ.clear()
    os.environ.update(env)
    rank_zero_only.rank = 0
    torch.set_num_threads(threads)
    if torch.are_deterministic_algorithms_enabled() != deterministic:  # the call imports torch._dynamo: skip it
        torch.use_deterministic_algorithms(deterministic)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        pytest.fail("a test left a torch.distributed process group running")
