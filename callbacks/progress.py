"""ProgressBar: a tqdm bar per epoch and per evaluation (tqdm is imported only when a bar starts)."""

from __future__ import annotations

import math
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
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


class ProgressBar(Callback):
    """Shows training and evaluation progress on rank 0; metrics logged with prog_bar=True appear on it.

    On a terminal it draws tqdm bars, reading metrics (a device sync) only when tqdm redraws; when
    stdout is not a terminal it prints one plain line per epoch and per evaluation instead.
    `plain=None` decides by `sys.stdout.isatty()`.

    Args:
        refresh_rate: redraw every N batches.
        leave: keep each finished bar on screen.
        plain: True forces plain lines, False forces tqdm bars, None decides by the terminal.
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, plain: bool | None = None) -> None:
        self.refresh_rate = max(1, int(refresh_rate))
        self.leave = leave
        self.plain = plain
        self._bar: Any = None
        self._eval_bar: Any = None
        self._pending = 0

    def print(self, *args: Any, sep: str = " ", end: str = "\n", **kwargs: Any) -> None:
        """Print above an open tqdm bar without breaking it (what `TrainModule.print` calls); else plain print."""
        bar = self._eval_bar or self._bar
        if bar is None or isinstance(bar, _LineBar):
            print(*args, sep=sep, end=end, **kwargs)
            return
        bar.write(sep.join(map(str, args)), end=end, file=kwargs.get("file"))

    def _new_bar(self, trainer: Trainer, desc: str, total: int | float, leave: bool) -> Any:
        if not trainer.is_global_zero:
            return None
        plain = self.plain if self.plain is not None else not sys.stdout.isatty()
        if plain:
            return _LineBar(desc, total)
        from tqdm.auto import tqdm

        size = shutil.get_terminal_size((100, 24))  # a pty without a size reports 0 columns, and tqdm then
        rows = max(size.lines, 10)  # draws nothing; fall back to a usable size
        return tqdm(total=None if total == math.inf else int(total), desc=desc, leave=leave, ncols=size.columns,
                    nrows=rows, file=sys.stdout, mininterval=0.5, smoothing=0)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._close_train()
        self._bar = self._new_bar(trainer, f"Epoch {trainer.current_epoch}", trainer.num_training_batches, True)
        self._pending = 0

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._bar is None:
            return
        self._pending += 1
        if self._pending >= self.refresh_rate:
            if self._bar.update(self._pending):
                self._bar.set_postfix(trainer.progress_bar_metrics, refresh=False)
            self._pending = 0

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._bar is not None:
            self._bar.update(self._pending)
            self._bar.set_postfix(trainer.progress_bar_metrics, refresh=False)
            self._pending = 0
            if isinstance(self._bar, _LineBar):
                self._close_train()

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._close_train()

    def _close_train(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _eval_start(self, trainer: Trainer, desc: str) -> None:
        total = sum(_eval_batches(trainer)) if trainer.state.stage else 0
        self._eval_bar = self._new_bar(trainer, desc, total, False)

    def _eval_advance(self) -> None:
        if self._eval_bar is not None:
            self._eval_bar.update(1)

    def _eval_end(self, trainer: Trainer | None = None) -> None:
        if isinstance(self._eval_bar, _LineBar) and trainer is not None:
            self._eval_bar.set_postfix({k: v for k, v in trainer.progress_bar_metrics.items()})
        if self._eval_bar is not None:
            self._eval_bar.close()
            self._eval_bar = None

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer, "Sanity check" if trainer.sanity_checking else "Validation")

    def on_validation_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_advance()

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_end(trainer)

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer, "Testing")

    def on_test_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_advance()

    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_end(trainer)

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_bar = self._new_bar(trainer, "Predicting", sum(trainer.num_predict_batches), False)

    def on_predict_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_advance()

    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_end()

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        self._close_train()
        self._eval_end()


def _eval_batches(trainer: Trainer) -> list[int | float]:
    """The batch counts of the evaluation that is starting, one per loader."""
    if trainer.sanity_checking:
        return trainer.num_sanity_val_batches
    return trainer.num_test_batches if trainer.testing else trainer.num_val_batches
