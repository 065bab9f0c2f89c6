"""Real servers the tests start on 127.0.0.1 with a free port: moto's standalone S3 server and an MLflow tracking
server with a SQLite backend store. Each runs in its own process group and is killed with it at teardown."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from strategies.comm.distributed import find_free_port
from tests.helpers.tiers import allowed_processes

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class Server:
    url: str
    process: subprocess.Popen
    log: Path


def _wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before it was up:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.25)
    raise RuntimeError(f"server not up at {url} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


@contextmanager
def _serve(command: list[str], health: str, base: str, log: Path, env: dict[str, str],
           timeout: float, shared: bool = False) -> Iterator[Server]:
    """`shared`: a server cheap enough to be part of single-process tests (tests/helpers/tiers.py)."""
    with open(log, "wb") as out, allowed_processes() if shared else nullcontext():
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_until_up(health, process, log, timeout)
        yield Server(base, process, log)
    finally:
        _stop(process)


def _script(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise RuntimeError(f"the {name} command is not installed beside {sys.executable}")
    return found


@contextmanager
def moto_s3_server(folder: Path) -> Iterator[Server]:
    """moto's standalone server (a real S3 HTTP endpoint, objects kept in its memory). Started once per session in
    about 2 s, it keeps the S3 tests in `make check` (the MLflow server, 15-40 s, takes its tests out)."""
    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    with _serve([_script("moto_server"), "-H", "127.0.0.1", "-p", str(port)], f"{url}/moto-api/", url,
                folder / "moto.log", {**os.environ, **S3_CREDENTIALS}, timeout=60, shared=True) as server:
        yield server


@contextmanager
def mlflow_server(folder: Path) -> Iterator[Server]:
    """`mlflow server` with a SQLite backend store and artifacts served from a local folder, one worker, no job
    runner (starting it takes 15-40 s on the 2-core machine: start it once per module)."""
    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    command = [_script("mlflow"), "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with _serve(command, f"{url}/health", url, folder / "mlflow.log", env, timeout=240) as server:
        yield server
