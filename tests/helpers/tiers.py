"""Test tiers (docs/design.md, "Tests"): the pytest plugin that keeps every test in its tier without anyone
remembering a marker.

`make check` runs the tests that stay in the pytest process, plus the few multi-process tests marked `smoke`;
`make test` runs them all; `RELIABILITY_FULL=1` adds the `exhaustive` sweeps (the cases a default test already
covers, repeated). Whether a test leaves the pytest process is not left to its author: this plugin watches every
process the pytest process starts while a test runs (its fixtures included; a process started by a module- or
session-scoped fixture counts for every test that uses the fixture) and fails the test, naming the process, when
it starts one without the `subprocess` or `distributed` marker, or carries one of them and starts none.

Not counted: the processes a library starts on its own (LIBRARY_HELPERS: DataLoader workers, torch.compile's,
wandb's) and those started inside `allowed_processes()`: a prop of a single-process test (a sleeping child whose pid
is alive, a reaped one whose pid is dead, mount(8), a writer killed mid-save) or a server cheap enough to share
(moto's S3 server).
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import sys
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

FULL = os.environ.get("RELIABILITY_FULL") == "1"
OUT_OF_PROCESS = ("subprocess", "distributed")  # the markers that take a test out of `make check`
# Processes a library starts on its own, inside the test's process: DataLoader workers, torch.compile's compiler and
# compile workers, wandb's service (shared by every later run of the session), the git commands wandb and griffe
# run to describe the source, and the fc-list matplotlib runs to build its font cache on first import.
LIBRARY_HELPERS = tuple(os.sep + os.path.join(*parts, "") for parts in (
    ("torch", "utils", "data"), ("torch", "_inductor"), ("wandb",), ("griffe",), ("matplotlib",)))

_main_pid = os.getpid()
_started: list[str] = []  # processes started since the current test's setup began
_fixture_stack: list[Any] = []  # the FixtureDefs being set up, innermost last
_spawning_fixtures: set[tuple[str, str]] = set()  # (baseid, argname) of fixtures that started a process
_allowed = 0


@contextmanager
def allowed_processes() -> Iterator[None]:
    """Processes started inside are props or a shared server, not the test's own run: they keep it in `make check`."""
    global _allowed
    _allowed += 1
    try:
        yield
    finally:
        _allowed -= 1


def _from_a_library_helper() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in LIBRARY_HELPERS):
            return True
        frame = frame.f_back
    return False


def _record(what: str) -> None:
    if os.getpid() != _main_pid or _allowed or _from_a_library_helper():
        return
    _started.append(what)
    if _fixture_stack:
        fixturedef = _fixture_stack[-1]
        _spawning_fixtures.add((fixturedef.baseid, fixturedef.argname))


def _describe(args: Any) -> str:
    words = [os.fsdecode(a) for a in args] if isinstance(args, (list, tuple)) else [os.fsdecode(args)]
    return " ".join(" ".join(words).split())[:160]


_fork = os.fork
_execute_child = subprocess.Popen._execute_child
_fork_exec = _posixsubprocess.fork_exec


def _watched_fork() -> int:
    _record("a forked child (os.fork, multiprocessing's fork context)")
    return _fork()


def _watched_execute_child(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> Any:
    _record(f"subprocess: {_describe(args)}")
    return _execute_child(self, args, *rest, **kwargs)


def _watched_fork_exec(*args: Any, **kwargs: Any) -> Any:
    _record(f"multiprocessing's spawn/forkserver context: {_describe(args[0])}")
    return _fork_exec(*args, **kwargs)


os.fork = _watched_fork
subprocess.Popen._execute_child = _watched_execute_child
_posixsubprocess.fork_exec = _watched_fork_exec  # what multiprocessing's spawn and forkserver contexts call


def _fixture_started_a_process(item: pytest.Item) -> str | None:
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in defs.get(name, ()):
            if (fixturedef.baseid, fixturedef.argname) in _spawning_fixtures:
                return name
    return None


def _verdict(item: pytest.Item) -> str | None:
    """Why the test's markers do not match what it did, or None."""
    marked = [m for m in OUT_OF_PROCESS if item.get_closest_marker(m)]
    fixture = _fixture_started_a_process(item)
    if _started or fixture:
        if marked:
            return None
        what = "\n  ".join(dict.fromkeys(_started)) or f"fixture {fixture!r} started one (earlier, for another test)"
        return ("this test starts processes:\n  " + what + "\nmark it @pytest.mark.subprocess (one script, "
                "interpreter or server) or @pytest.mark.distributed (ranks, a launcher): `make check` leaves such "
                "tests out unless they are also marked smoke (docs/design.md, \"Tests\")")
    if marked:
        return (f"this test is marked {' and '.join(marked)} but started no process: remove the marker, so that "
                "`make check` runs it (docs/design.md, \"Tests\")")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL:
        return
    kept = [item for item in items if not item.get_closest_marker("exhaustive")]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("exhaustive")])
        items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _started.clear()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Generator[None, Any, Any]:
    _fixture_stack.append(fixturedef)
    try:
        return (yield)
    finally:
        _fixture_stack.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if call.when == "teardown" and report.passed and getattr(item, "_tiers_call_passed", False):
        problem = _verdict(item)
        if problem is not None:
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid}: {problem}"
    elif call.when == "call":
        item._tiers_call_passed = report.passed
    return report
