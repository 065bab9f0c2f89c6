"""Optional packages missing: a clear error naming the extra to install. One fresh interpreter in which importing
s3fs, mlflow and wandb fails (as on a machine without the extras) tries each feature; the tests read its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
for name in ("s3fs", "mlflow", "wandb"):
    sys.modules[name] = None
report = {}
def attempt(key, fn):
    try:
        fn()
        report[key] = "no error"
    except Exception as err:
        report[key] = f"{type(err).__name__}: {err}"
from callbacks import ModelCheckpoint
from trainer.loggers import MLFlowLogger, WandbLogger
attempt("s3", lambda: ModelCheckpoint(dirpath="s3://bucket/ckpts"))
attempt("mlflow", lambda: MLFlowLogger())
attempt("wandb", lambda: WandbLogger())
print(json.dumps(report))
"""


pytestmark = pytest.mark.subprocess  # every test reads the report of one fresh interpreter without the packages


@pytest.fixture(scope="module")
def report() -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_s3_path_without_s3fs(report: dict[str, str]):
    assert report["s3"] == ("ConfigError: 's3://bucket/ckpts' needs the package behind 's3://': "
                            'pip install "trainer[s3]" (or pip install s3fs).')


@pytest.mark.parametrize(("logger", "package"), [("MLFlowLogger", "mlflow"), ("WandbLogger", "wandb")])
def test_tracking_logger_without_its_package(report: dict[str, str], logger: str, package: str):
    assert report[package] == (f"ModuleNotFoundError: {logger} needs the '{package}' package, which is not "
                               f'installed: pip install "trainer[{package}]" (or pip install {package}).')
