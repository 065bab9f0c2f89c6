"""Test hygiene: every test runs in its own temp dir, with env vars, rank-zero state, determinism
and torch threads restored afterwards, so tests cannot leak into each other or the repo tree."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from strategies.comm.distributed import rank_zero_only

pytest_plugins = ["tests.helpers.tiers"]  # the test tiers: a test's markers must match the processes it starts

# Ctrl-C as from a terminal, whatever started pytest: a background job of a non-interactive script (`cmd &`,
# as a CI runner may start it) inherits SIGINT ignored, and an ignored signal stays ignored across exec, so the
# Trainer (which leaves a SIGINT disposition it did not install alone) and every process the tests start would
# never see the Ctrl-C the interrupt tests send. Python's own handler is reset to the default across exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


# --- remote storage: moto's standalone S3 server (started once per session, on first use) ----------------------
@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    pytest.importorskip("s3fs", reason="s3:// paths need s3fs: pip install -e '.[s3]' (in .[dev])")
    pytest.importorskip("moto", reason="the S3 tests need moto's server: pip install -e '.[dev]'")
    from tests.helpers.servers import moto_s3_server

    with moto_s3_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A new, empty bucket on the moto server; the environment points s3fs/boto at it (children inherit it)."""
    import uuid

    import fsspec

    from tests.helpers.servers import S3_CREDENTIALS

    for key, value in {**S3_CREDENTIALS, "AWS_ENDPOINT_URL": s3_server.url}.items():
        monkeypatch.setenv(key, value)
    fsspec.get_filesystem_class("s3").clear_instance_cache()  # an instance made for another endpoint is stale
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3").mkdir(bucket)
    yield f"s3://{bucket}"
    fsspec.get_filesystem_class("s3").clear_instance_cache()


@pytest.fixture
def memory_root():
    """A fresh memory:// folder, emptied afterwards (the memory filesystem is global to the process)."""
    import uuid

    import fsspec

    root = f"memory://test-{uuid.uuid4().hex[:12]}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
