"""The tier check (tests/helpers/tiers.py): a test whose markers do not say whether it starts processes fails, so a
new test lands in its tier (`make check` or only `make test`) without anyone remembering a marker; the exhaustive
sweeps run only with RELIABILITY_FULL=1. An inner pytest session runs a file of small tests under the plugin."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import os, subprocess, sys

import pytest
from torch.utils.data import DataLoader

from tests.helpers.tiers import allowed_processes


def _child():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_unmarked_and_starts_one():
    _child()


@pytest.mark.subprocess
def test_marked_and_starts_one():
    _child()


@pytest.mark.distributed
def test_marked_and_starts_none():
    pass


def test_unmarked_and_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def test_unmarked_with_a_prop():
    with allowed_processes():
        _child()


def test_unmarked_with_dataloader_workers():
    assert sorted(int(x) for x in DataLoader(list(range(4)), num_workers=2)) == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def server():
    _child()


@pytest.mark.subprocess
def test_marked_first_user_of_a_fixture_that_starts_one(server):
    pass


def test_unmarked_later_user_of_a_fixture_that_started_one(server):
    pass


@pytest.mark.exhaustive
def test_a_sweep():
    pass
'''


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, full: str,
         ) -> tuple[pytest.RunResult, dict[str, str]]:
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("RELIABILITY_FULL", full)
    result = pytester.runpytest_subprocess("-p", "tests.helpers.tiers", "-p", "no:cacheprovider", "-rA",
                                           timeout=240)
    outcomes = {}
    for line in result.outlines:
        for word in ("PASSED", "ERROR", "FAILED"):
            if line.startswith(word + " test_inner.py::"):
                outcomes[line.split("::")[1].split()[0]] = word
    return result, outcomes


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_markers_must_match_the_processes_a_test_starts(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    result, outcomes = _run(pytester, monkeypatch, "0")
    assert outcomes == {
        "test_unmarked_and_starts_one": "ERROR",  # fails at teardown, naming the process and the markers
        "test_marked_and_starts_one": "PASSED",
        "test_marked_and_starts_none": "ERROR",
        "test_unmarked_and_forks": "ERROR",
        "test_unmarked_with_a_prop": "PASSED",
        "test_unmarked_with_dataloader_workers": "PASSED",
        "test_marked_first_user_of_a_fixture_that_starts_one": "PASSED",
        "test_unmarked_later_user_of_a_fixture_that_started_one": "ERROR",
    }, result.stdout.str()[-6000:]
    text = result.stdout.str()
    assert "this test starts processes:" in text and "-c pass" in text and "@pytest.mark.subprocess" in text
    assert "is marked distributed but started no process" in text
    assert "fixture 'server' started one" in text
    assert "1 deselected" in text  # the exhaustive sweep, without RELIABILITY_FULL=1


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_reliability_full_runs_the_exhaustive_sweeps(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    _, outcomes = _run(pytester, monkeypatch, "1")
    assert outcomes["test_a_sweep"] == "PASSED"
