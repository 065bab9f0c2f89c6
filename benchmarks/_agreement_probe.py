"""Times what a rank spends in the step agreement's own calls (benchmarks/agreement.py). Benchmark-only.

Importing this module wraps the control plane's entry points with a clock: in strategies.comm.distributed a blocking
round, the start of an overlapped one and the wait for it; on this machine's shared-memory board
(strategies/comm/agreement_board.py) a post and the wait for it. Under `ddp_spawn` each rank imports it when it
unpickles `AgreementTimer`, so the clock runs in the ranks; the callback's state brings rank 0's figures back. With
`NO_BOARD_VAR=1` in the environment the ranks open no board, so the overlapped round is a gloo all-reduce (as for
ranks on several machines).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from common import StepClock

from callbacks import Callback
from strategies.comm import distributed
from strategies.comm.agreement_board import AgreementBoard, PendingPost

NO_BOARD_VAR = "AGREEMENT_PROBE_NO_BOARD"

# Seconds inside the agreement's calls since the process started: all of them, and the waits for overlapped rounds.
_SPENT = {"all": 0.0, "wait": 0.0}


def _clocked(fn: Callable[..., Any], wait: bool = False) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - start
            _SPENT["all"] += took
            if wait:
                _SPENT["wait"] += took

    return wrapper


if not hasattr(distributed.PendingMax.wait, "__wrapped__"):
    distributed.PendingMax.wait = _clocked(distributed.PendingMax.wait, wait=True)  # type: ignore[method-assign]
    distributed.start_all_reduce_max_ints = _clocked(distributed.start_all_reduce_max_ints)
    distributed.all_reduce_max_ints = _clocked(distributed.all_reduce_max_ints)
    AgreementBoard.post = _clocked(AgreementBoard.post)  # type: ignore[method-assign]
    PendingPost.wait = _clocked(PendingPost.wait, wait=True)  # type: ignore[method-assign]
    if os.environ.get(NO_BOARD_VAR) == "1":
        AgreementBoard.open = classmethod(lambda cls, *args: None)  # type: ignore[method-assign,assignment]


class AgreementTimer(Callback):
    """Rank 0's batch-end stamps and, per batch, the seconds spent in the agreement's calls during it."""

    def __init__(self) -> None:
        self.clock = StepClock()
        self.spent: list[float] = []
        self.waited: list[float] = []
        self._last = dict(_SPENT)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.is_global_zero:
            self.clock.tick()
            self.spent.append(_SPENT["all"] - self._last["all"])
            self.waited.append(_SPENT["wait"] - self._last["wait"])
            self._last = dict(_SPENT)

    def state_dict(self) -> dict[str, Any]:
        return {"wall": list(self.clock.wall), "spent": list(self.spent), "waited": list(self.waited)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.clock.wall, self.spent = list(state_dict["wall"]), list(state_dict["spent"])
        self.waited = list(state_dict["waited"])
