"""`Profiler`: the base of the profilers `Trainer(profiler=...)` takes (Lightning's `lightning.pytorch.profilers`
names and arguments). A profiler times named actions (`start`/`stop`, or `with profiler.profile(name)`); the
Trainer names them as Lightning does (`run_training_epoch`, `run_training_batch`, `[Callback]<state_key>.<hook>`,
`[LightningModule]<Class>.<hook>`, `[Strategy]<Class>.training_step`, ...) and asks for the report at the end of
every fit, validate, test and predict (`describe`).

Where the report goes: with a `filename`, into `dirpath` (default: the run's log folder) as
`<stage>-<filename>[-<local rank>].txt`; without one, to the log on local rank 0 (Lightning's choice). The string
shortcuts (`profiler="simple"` ...) set `filename="profile"`, so a run's report is also kept beside its logs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_NULL = nullcontext()


class Profiler:
    """Override `start`, `stop` and `summary` (Lightning's interface)."""

    enabled = True

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._stage: str | None = None
        self._local_rank: int | None = None

    def start(self, action_name: str) -> None:
        """Begin timing `action_name`."""
        raise NotImplementedError(f"{type(self).__name__} must define start(action_name)")

    def stop(self, action_name: str) -> None:
        """End timing `action_name`."""
        raise NotImplementedError(f"{type(self).__name__} must define stop(action_name)")

    def summary(self) -> str:
        """The report of what was recorded ("" when there is nothing to say)."""
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """Time the block as `action_name`."""
        self.start(action_name)
        try:
            yield action_name
        finally:
            self.stop(action_name)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | Path | None = None) -> None:
        """Called by the Trainer when a run starts: the stage names the report, the rank its file."""
        self._stage, self._local_rank = stage, local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """Called after `describe`: release what the run used."""

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    def describe(self) -> None:
        """Write the report (see the module docstring), then `teardown`."""
        report = self.summary()
        if report:
            path = self.report_path(".txt")
            if path is None:
                if self.local_rank == 0:
                    log.info(report)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a", encoding="utf-8") as out:
                    out.write(report + "\n")
        self.teardown(self._stage)

    def report_path(self, extension: str, action: str | None = None) -> Path | None:
        """`<dirpath>/<stage>-<filename>-<rank>[-<action>]<extension>`, or None without a filename or folder."""
        if not self.filename or not self.dirpath:
            return None
        parts = [p for p in (self._stage, self.filename, _rank(self._local_rank), action) if p]
        name = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", "-".join(parts))).strip() or "profile"
        return Path(self.dirpath) / (name + extension)

    def action(self, action_name: str) -> AbstractContextManager[Any]:
        """What the Trainer wraps an action in."""
        return self.profile(action_name)

    def header(self) -> str:
        return f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"


def _rank(local_rank: int | None) -> str | None:
    return None if local_rank is None else str(local_rank)


class PassThroughProfiler(Profiler):
    """No profiling: what `profiler=None` means. The Trainer then adds nothing to any hook or step."""

    enabled = False

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def action(self, action_name: str) -> AbstractContextManager[Any]:
        return _NULL
