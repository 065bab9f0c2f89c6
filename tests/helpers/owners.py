"""Temp-file owners for tests: a tag naming a process that has exited, as a writer killed mid-save leaves."""

from __future__ import annotations

import subprocess
import sys

from strategies.checkpoint_io.temp_owner import owner_tag
from tests.helpers.tiers import allowed_processes


def dead_owner_tag() -> str:
    """An owner tag (strategies/checkpoint_io/temp_owner.py) of this machine whose process has exited and been
    reaped."""
    with allowed_processes():  # a pid to read, not a run: the test stays in `make check`
        child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return owner_tag(child.pid)
