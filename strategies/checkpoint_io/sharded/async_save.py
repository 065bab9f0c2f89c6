"""Asynchronous sharded saves (`sharded_checkpoint="async"`): training goes on while a background thread writes.

The save itself stays collective and runs in two halves. On the training thread, every rank stages a CPU copy of its
shards (DCP's DefaultStager) and of the non-sharded state, so the step after the save may change the live tensors.
A background thread then writes the shards with DCP over a gloo group kept for checkpoints (never the training
group: two threads must not interleave collectives on one group), and rank 0 commits (manifest last, then the
rename or commit record) exactly as a synchronous save does. A crash before the commit leaves the previous
checkpoint as it was.

At most one save is in flight per rank: the next save, the end of fit, and the failure path wait for it first.
Its error is kept and raised on every rank at the next collective wait (`wait`), never dropped. Deleting an older
checkpoint (ModelCheckpoint's top-k) is deferred until the save that replaces it has committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_WRITER_NAME = "trainer-checkpoint-writer"


class AsyncSaver:
    """This rank's one in-flight sharded save, its error, and the removals waiting for its commit."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._removals: list[Callable[[], None]] = []
        self._group: Any = None

    def group(self, timeout: timedelta | None) -> Any:
        """Collective on first use: the gloo group the background writes use (created once per process group)."""
        import torch.distributed as dist

        if self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=timeout)
        return self._group

    def forget_group(self) -> None:
        """The process group is gone (end of a run): a later run makes a new one."""
        self._group = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def start(self, work: Callable[[], str | None]) -> None:
        """Run `work` (returns an error message or None) in the background. The caller has waited for the last."""
        assert self._thread is None, "a sharded save is already in flight: wait for it first"

        def run() -> None:
            try:
                self._error = work()
            except BaseException as err:  # noqa: BLE001 - kept and raised on the training thread at the next wait
                self._error = f"{type(err).__name__}: {err}"

        self._error = None
        self._thread = threading.Thread(target=run, name=_WRITER_NAME, daemon=True)
        self._thread.start()

    def defer(self, action: Callable[[], None]) -> bool:
        """Queue `action` until the in-flight save commits; False (run it now) when no save is in flight."""
        if self._thread is None:
            return False
        self._removals.append(action)
        return True

    def join(self) -> str | None:
        """Local, no collective: wait for the in-flight save; run the deferred actions if it committed (else drop
        them: the older checkpoints stay). Returns the save's error, or None."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        error, self._error = self._error, None
        actions, self._removals = self._removals, []
        if error is None:
            for action in actions:
                action()
        return error
