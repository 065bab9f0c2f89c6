"""ProgressBar: Lightning's TQDMProgressBar on ProgressBarBase's rules (tqdm is imported only when a bar opens)."""

from __future__ import annotations

import math
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from callbacks.progress_base import EVAL, TRAIN, ProgressBarBase

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class _LineBar:
    """What a bar becomes when stdout is not a terminal (CI logs, `| tee`): one plain line when it closes."""

    def __init__(self, desc: str, total: int | float) -> None:
        self.desc, self.total, self.n = desc, total, 0
        self.postfix: dict[str, float] = {}
        self.start = time.monotonic()

    def update(self, n: int = 1) -> bool:
        self.n += n
        return False  # never redraws, so metrics are read only once, at close

    def set_postfix(self, metrics: dict[str, float], refresh: bool = True) -> None:
        self.postfix = dict(metrics)

    def close(self) -> None:
        total = "?" if self.total == math.inf else int(self.total)
        metrics = "".join(f", {k}={v:.4g}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}/{total} batches in {time.monotonic() - self.start:.1f}s{metrics}", flush=True)


class ProgressBar(ProgressBarBase):
    """Shows training and evaluation progress on rank 0 (Lightning's `TQDMProgressBar`); metrics logged with
    prog_bar=True (and the logger's version, `v_num`) appear on the training bar.

    On a terminal it draws tqdm bars, reading metrics (a device sync) only when tqdm redraws; when
    stdout is not a terminal it prints one plain line per epoch and per evaluation instead.
    `plain=None` decides by `sys.stdout.isatty()`.

    Args:
        refresh_rate: redraw every N batches.
        leave: keep each epoch's finished training bar on screen (else one bar is redrawn for every epoch).
        plain: True forces plain lines, False forces tqdm bars, None decides by the terminal.
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, plain: bool | None = None) -> None:
        super().__init__()
        self.refresh_rate = max(1, int(refresh_rate))
        self.leave = leave
        self.plain = plain
        self._bars: dict[str, Any] = {}
        self._pending = 0  # training batches done but not yet passed to tqdm

    def print(self, *args: Any, sep: str = " ", end: str = "\n", **kwargs: Any) -> None:
        """Print above an open tqdm bar without breaking it (what `TrainModule.print` calls); else plain print."""
        bar = self._bars.get(EVAL) or self._bars.get(TRAIN)
        if bar is None or isinstance(bar, _LineBar):
            print(*args, sep=sep, end=end, **kwargs)
            return
        bar.write(sep.join(map(str, args)), end=end, file=kwargs.get("file"))

    def _new_bar(self, desc: str, total: int | float, leave: bool) -> Any:
        plain = self.plain if self.plain is not None else not sys.stdout.isatty()
        if plain:
            return _LineBar(desc, total)
        from tqdm.auto import tqdm

        size = shutil.get_terminal_size((100, 24))  # a pty without a size reports 0 columns, and tqdm then
        rows = max(size.lines, 10)  # draws nothing; fall back to a usable size
        return tqdm(total=None if total == math.inf else int(total), desc=desc, leave=leave, ncols=size.columns,
                    nrows=rows, file=sys.stdout, mininterval=0.5, smoothing=0)

    def _open(self, role: str, description: str, total: int | float) -> None:
        self._pending = 0
        bar = self._bars.get(role)
        if role == TRAIN and not self.leave and bar is not None and not isinstance(bar, _LineBar):
            bar.reset(total=None if total == math.inf else int(total))  # one training bar, redrawn each epoch
            bar.set_description(description, refresh=False)
            return
        self._close(role, hide=False)
        self._bars[role] = self._new_bar(description, total, leave=role == TRAIN)

    def _advance(self, role: str, completed: int) -> bool:
        bar = self._bars.get(role)
        if bar is None:
            return False
        if role == EVAL:
            bar.update(1)
            return False
        self._pending += 1
        if self._pending < self.refresh_rate:
            return False
        redraws = bool(bar.update(self._pending))
        self._pending = 0
        return redraws

    def _show_metrics(self, metrics: dict[str, Any]) -> None:
        bar = self._bars.get(TRAIN)
        if bar is None:
            return
        if self._pending:  # the epoch ends: count the batches the refresh rate held back
            bar.update(self._pending)
            self._pending = 0
        bar.set_postfix(metrics, refresh=False)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if isinstance(self._bars.get(TRAIN), _LineBar):
            self._close(TRAIN, hide=False)  # a plain line is written once the epoch (and its validation) is over

    def _close(self, role: str, hide: bool) -> None:
        bar = self._bars.pop(role, None)
        if bar is None:
            return
        if role == EVAL and isinstance(bar, _LineBar) and not self.trainer.predicting:
            bar.set_postfix(self.get_metrics(self.trainer, self.trainer.lightning_module))
        bar.close()

    def _stop(self) -> None:
        for role in (TRAIN, EVAL):
            self._close(role, hide=False)
