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


def _shown(value: Any) -> str:
    """A metric as a plain line shows it: numbers to 4 significant digits, anything else (a W&B run id as `v_num`)
    as its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, ".4g")
    return str(value)


class _LineBar:
    """What a bar becomes when stdout is not a terminal (CI logs, `| tee`): one plain line when it closes."""

    def __init__(self, desc: str, total: int | float) -> None:
        self.desc, self.total, self.n = desc, total, 0
        self.postfix: dict[str, Any] = {}
        self.start = time.monotonic()

    def update(self, n: int = 1) -> bool:
        self.n += n
        return False  # never redraws, so metrics are read only once, at close

    def set_postfix(self, metrics: dict[str, Any], refresh: bool = True) -> None:
        self.postfix = dict(metrics)

    def close(self) -> None:
        total = "?" if self.total == math.inf else int(self.total)
        metrics = "".join(f", {k}={_shown(v)}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}/{total} batches in {time.monotonic() - self.start:.1f}s{metrics}", flush=True)


class ProgressBar(ProgressBarBase):
    """Shows training and evaluation progress on rank 0 (Lightning's `TQDMProgressBar`); metrics logged with
    prog_bar=True (and the logger's version, `v_num`) appear on the training bar.

    On a terminal it draws tqdm bars, reading metrics (a device sync) only when tqdm redraws; when
    stdout is not a terminal it prints one plain line per epoch and per evaluation instead.
    `plain=None` decides by `sys.stdout.isatty()`. Each tqdm bar comes from `init_train_tqdm`, `init_sanity_tqdm`,
    `init_validation_tqdm`, `init_test_tqdm` or `init_predict_tqdm`, as in Lightning: override one to customise
    that bar (an overridden one is used off a terminal too). The bars are `train_progress_bar`,
    `val_progress_bar`, `test_progress_bar` and `predict_progress_bar` (a plain-line bar off a terminal).

    Args:
        refresh_rate: redraw every N batches; 0 disables the bar.
        process_position: the tqdm `position` (times 2) of this bar set, for several Trainers drawing at once.
        leave: keep each epoch's finished training bar on screen (else one bar is redrawn for every epoch).
        plain: True forces plain lines, False forces tqdm bars, None decides by the terminal.
    """

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
    """tqdm's `bar_format` of every bar the `init_*_tqdm` methods make."""

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False,
                 plain: bool | None = None) -> None:
        super().__init__()
        if refresh_rate < 0:
            raise ValueError(f"ProgressBar(refresh_rate={refresh_rate}): use 0 (no bar) or a positive int.")
        self.refresh_rate = int(refresh_rate)
        self.process_position = process_position
        self.leave = leave
        self.plain = plain
        self._bars: dict[str, Any] = {}
        self._made: dict[str, Any] = {}  # the latest bar of each kind, kept after it closes (train_progress_bar, ...)
        self._pending = 0  # training batches done but not yet passed to tqdm

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        state["_bars"], state["_made"] = {}, {}  # tqdm objects do not pickle (ddp_spawn sends the callbacks)
        return state

    @property
    def is_enabled(self) -> bool:
        """Drawing: not disabled (`disable()`, a rank other than 0) and `refresh_rate` above 0."""
        return self._enabled and self.refresh_rate > 0

    # --- the bars, by kind -------------------------------------------------------------------------------------
    def _bar(self, kind: str) -> Any:
        bar = self._made.get(kind)
        if bar is None:
            raise TypeError(f"The `{type(self).__name__}.{kind}_progress_bar` reference has not been set yet: it is "
                            f"made when the {kind} loop first shows progress.")
        return bar

    def _set_bar(self, kind: str, bar: Any) -> None:
        self._made[kind] = bar
        self._bars[TRAIN if kind == "train" else EVAL] = bar

    train_progress_bar = property(lambda self: self._bar("train"), lambda self, bar: self._set_bar("train", bar))
    """The training bar (settable); TypeError before training first shows progress."""
    val_progress_bar = property(lambda self: self._bar("val"), lambda self, bar: self._set_bar("val", bar))
    """The validation (or sanity-check) bar (settable); TypeError before one was shown."""
    test_progress_bar = property(lambda self: self._bar("test"), lambda self, bar: self._set_bar("test", bar))
    """The test bar (settable); TypeError before one was shown."""
    predict_progress_bar = property(lambda self: self._bar("predict"), lambda self, bar: self._set_bar("predict", bar))
    """The predict bar (settable); TypeError before one was shown."""

    def _tqdm(self, description: str, leave: bool, position: int, **extra: Any) -> Any:
        from callbacks.tqdm_bar import Tqdm

        size = shutil.get_terminal_size((100, 24))  # a pty without a size reports 0 columns, and tqdm then
        rows = max(size.lines, 10)  # draws nothing; fall back to a usable size
        return Tqdm(desc=description, position=position, disable=self.is_disabled, leave=leave, ncols=size.columns,
                    nrows=rows, file=sys.stdout, mininterval=0.5, bar_format=self.BAR_FORMAT, **extra)

    def init_sanity_tqdm(self) -> Any:
        """The bar of the sanity-check validation; override to customise it."""
        return self._tqdm(self.sanity_check_description, False, 2 * self.process_position)

    def init_train_tqdm(self) -> Any:
        """The training bar; override to customise it."""
        return self._tqdm(self.train_description, True, 2 * self.process_position, smoothing=0)

    def init_predict_tqdm(self) -> Any:
        """The predict bar; override to customise it."""
        return self._tqdm(self.predict_description, True, 2 * self.process_position, smoothing=0)

    def init_validation_tqdm(self) -> Any:
        """The validation bar (below the training bar during fit); override to customise it."""
        beside_training = self.trainer.state.fn != "validate"
        return self._tqdm(self.validation_description, not beside_training,
                          2 * self.process_position + beside_training)

    def init_test_tqdm(self) -> Any:
        """The test bar; override to customise it."""
        return self._tqdm(self.test_description, True, 2 * self.process_position)

    def print(self, *args: Any, sep: str = " ", end: str = "\n", **kwargs: Any) -> None:
        """Print above an open tqdm bar without breaking it (what `TrainModule.print` calls); else plain print."""
        bar = self._bars.get(EVAL) or self._bars.get(TRAIN)
        if bar is None or isinstance(bar, _LineBar):
            print(*args, sep=sep, end=end, **kwargs)
            return
        bar.write(sep.join(map(str, args)), end=end, file=kwargs.get("file"))

    def _kind(self, role: str) -> tuple[str, str]:
        """(bar kind, its init method) for a bar opening now in `role`."""
        if role == TRAIN:
            return "train", "init_train_tqdm"
        trainer = self.trainer
        if trainer.sanity_checking:
            return "val", "init_sanity_tqdm"
        if trainer.testing:
            return "test", "init_test_tqdm"
        if trainer.predicting:
            return "predict", "init_predict_tqdm"
        return "val", "init_validation_tqdm"

    def _new_bar(self, role: str, description: str, total: int | float) -> Any:
        kind, init = self._kind(role)
        customised = getattr(type(self), init) is not getattr(ProgressBar, init)
        plain = self.plain if self.plain is not None else not sys.stdout.isatty()
        if plain and not customised:
            bar: Any = _LineBar(description, total)
        else:
            bar = getattr(self, init)()
            bar.reset(total=None if total == math.inf else int(total))
            bar.set_description(description, refresh=False)
        self._made[kind] = bar
        return bar

    def _open(self, role: str, description: str, total: int | float) -> None:
        self._pending = 0
        bar = self._bars.get(role)
        if role == TRAIN and not self.leave and bar is not None and not isinstance(bar, _LineBar):
            bar.reset(total=None if total == math.inf else int(total))  # one training bar, redrawn each epoch
            bar.set_description(description, refresh=False)
            return
        self._close(role, hide=False)
        self._bars[role] = self._new_bar(role, description, total)

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
