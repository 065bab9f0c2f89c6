"""Context managers a precision enters around every step: autocast built once and reused, and torch's default
dtype set for the step (strategies/precision.py)."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

import torch


class ReusedAutocast(AbstractContextManager):
    """`torch.autocast(device_type, dtype)` around a step, built once per thread and nesting depth.

    Building a `torch.autocast` checks the device's support for the dtype (on CUDA it reads the device's
    properties): about 20 us per step on a host-bound GPU model, where a raw loop builds its autocast once.
    An autocast object keeps what it restores on exit, so one in use is never entered again: DataParallel's
    threads and a step that runs inside another step each take their own.
    """

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        self.device_type, self.dtype = device_type, dtype
        self._local = _AutocastStacks()

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles the strategy: the thread-local stays behind
        return {"device_type": self.device_type, "dtype": self.dtype}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["device_type"], state["dtype"])  # type: ignore[misc]

    def __enter__(self) -> None:
        local = self._local
        context = local.free.pop() if local.free else torch.autocast(self.device_type, dtype=self.dtype)
        local.entered.append(context)
        context.__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        local = self._local
        context = local.entered.pop()
        try:
            context.__exit__(*exc_info)
        finally:
            local.free.append(context)


class _AutocastStacks(threading.local):
    """Per thread: the autocast objects free for reuse and those entered now (a thread's first access runs
    `__init__`, so the per-step code needs no check that they exist)."""

    def __init__(self) -> None:
        self.free: list[torch.autocast] = []
        self.entered: list[torch.autocast] = []


class DefaultDtype(AbstractContextManager):
    """Sets torch's default dtype for the duration of a step, so tensors the step creates match the params.

    The default dtype is process-global, not thread-local: DataParallel's worker threads enter together,
    so the first one in saves the old dtype and the last one out restores it.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = torch.float32

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles the strategy: a lock cannot travel
        return {"dtype": self.dtype}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dtype"])  # type: ignore[misc]

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._saved = torch.get_default_dtype()
                torch.set_default_dtype(self.dtype)
            self._depth += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                torch.set_default_dtype(self._saved)
