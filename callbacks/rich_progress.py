"""RichProgressBar: ProgressBarBase's bars drawn with rich (rich is imported only when the callback is made)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torch import Tensor

from callbacks.progress_base import TRAIN, ProgressBarBase
from callbacks.rich_model_summary import _require_rich

if TYPE_CHECKING:
    from trainer.trainer import Trainer


@dataclass
class RichProgressBarTheme:
    """Styles of the bar's parts (rich style strings or `rich.style.Style`), and how metrics are written.

    Args:
        description: the bar's description ("Epoch 1/9", "Validation", ...).
        progress_bar: the bar while it runs; `progress_bar_finished` when done; `progress_bar_pulse` when the
            total is unknown.
        batch_progress: the "done/total" counter.
        time: elapsed and remaining time.
        processing_speed: batches per second.
        metrics: the metrics text; `metrics_text_delimiter` between metrics; `metrics_format` for numbers.
    """

    description: Any = ""
    progress_bar: Any = "#6206E0"
    progress_bar_finished: Any = "#6206E0"
    progress_bar_pulse: Any = "#6206E0"
    batch_progress: Any = ""
    time: Any = "dim"
    processing_speed: Any = "dim underline"
    metrics: Any = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


def _columns(theme: RichProgressBarTheme, bar: RichProgressBar) -> list[Any]:
    """The columns of each bar: description, bar, done/total, elapsed • remaining, speed, then the metrics."""
    from rich.progress import BarColumn, ProgressColumn, Task, TextColumn
    from rich.text import Text

    class Batches(ProgressColumn):
        def render(self, task: Task) -> Text:
            total = "--" if task.total is None else int(task.total)
            return Text(f"{int(task.completed)}/{total}", style=theme.batch_progress)

    class Times(ProgressColumn):
        max_refresh = 0.5  # redraw the clock at most twice a second, so it does not flicker

        def render(self, task: Task) -> Text:
            elapsed = task.finished_time if task.finished else task.elapsed
            remaining = task.time_remaining if task.total is not None else None
            clock = [("-:--:--" if t is None else str(timedelta(seconds=int(t)))) for t in (elapsed, remaining)]
            return Text(" • ".join(clock), style=theme.time)

    class Speed(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(f"{task.speed or 0:.2f}it/s", style=theme.processing_speed)

    class Metrics(ProgressColumn):
        def render(self, task: Task) -> Text:
            if task.id != bar.train_progress_bar_id:
                return Text()
            return Text(theme.metrics_text_delimiter.join(bar.metrics_texts()), justify="left", style=theme.metrics)

    return [TextColumn("[progress.description]{task.description}"),
            BarColumn(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                      pulse_style=theme.progress_bar_pulse),
            Batches(), Times(), Speed(), Metrics()]


class RichProgressBar(ProgressBarBase):
    """Progress bars drawn with rich, on rank 0 (Lightning's `RichProgressBar`): a training bar per epoch with the
    `prog_bar=True` metrics beside it, and a bar per evaluation dataloader (sanity check, validation, test,
    predict). Needs the `rich` package. Only one progress bar may be given to a Trainer; this one replaces the
    default `ProgressBar`, and the default model summary becomes `RichModelSummary`.

    Args:
        refresh_rate: redraws per second at most; 0 draws nothing.
        leave: keep each epoch's finished training bar on screen (else one bar is reused).
        theme: the styles of the bars (`RichProgressBarTheme`).
        console_kwargs: arguments of the `rich.console.Console` the bars are drawn on (e.g. `{"file": f}`).

    Example:
        ```python
        trainer = Trainer(callbacks=[RichProgressBar(leave=True)])
        ```
    """

    def __init__(self, refresh_rate: int = 100, leave: bool = False,
                 theme: RichProgressBarTheme = RichProgressBarTheme(),  # noqa: B008 (Lightning's default)
                 console_kwargs: dict[str, Any] | None = None) -> None:
        _require_rich("RichProgressBar")
        super().__init__()
        self._refresh_rate = refresh_rate
        self._leave = leave
        self.theme = theme
        self._console_kwargs = dict(console_kwargs or {})
        self.progress: Any = None  # the rich.progress.Progress of the running stage (kept after it stops)
        self._stopped = True
        self._ids: dict[str, Any] = {}
        self._kind_ids: dict[str, Any] = {}  # the latest task of each kind: sanity, val, test, predict
        self._metrics: dict[str, Any] = {}
        self._drawn_at = 0.0

    @property
    def refresh_rate(self) -> int:
        return self._refresh_rate

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self._refresh_rate > 0

    @property
    def train_progress_bar_id(self) -> Any:
        """The rich task id of the training bar (None before the first epoch)."""
        return self._ids.get(TRAIN)

    val_sanity_progress_bar_id = property(lambda self: self._kind_ids.get("sanity"),
                                          doc="The rich task id of the sanity-check bar, or None.")
    val_progress_bar_id = property(lambda self: self._kind_ids.get("val"),
                                   doc="The rich task id of the latest validation bar, or None.")
    test_progress_bar_id = property(lambda self: self._kind_ids.get("test"),
                                    doc="The rich task id of the latest test bar, or None.")
    predict_progress_bar_id = property(lambda self: self._kind_ids.get("predict"),
                                       doc="The rich task id of the latest predict bar, or None.")
    train_progress_bar = property(lambda self: self._task(self.train_progress_bar_id),
                                  doc="The rich `Task` of the training bar.")
    val_sanity_check_bar = property(lambda self: self._task(self.val_sanity_progress_bar_id),
                                    doc="The rich `Task` of the sanity-check bar.")
    val_progress_bar = property(lambda self: self._task(self.val_progress_bar_id),
                                doc="The rich `Task` of the latest validation bar.")
    test_progress_bar = property(lambda self: self._task(self.test_progress_bar_id),
                                 doc="The rich `Task` of the latest test bar.")

    def _task(self, task_id: Any) -> Any:
        if task_id is None or self.progress is None:
            raise TypeError(f"{type(self).__name__}: that bar has not been shown yet.")
        return next(task for task in self.progress.tasks if task.id == task_id)

    def configure_columns(self, trainer: Trainer) -> list[Any]:
        """The rich columns of every bar (description, bar, batches, times, speed, and the training metrics);
        override to draw other ones."""
        return _columns(self.theme, self)

    def refresh(self) -> None:
        """Redraw the bars now."""
        if self.progress is not None and not self._stopped:
            self._draw()

    def train_epoch_description(self, epoch: int) -> str:
        """Lightning's "Epoch N/last", padded to the width of "Validation" so the bars do not jump."""
        text = f"Epoch {epoch}"
        if self.trainer.max_epochs is not None and self.trainer.max_epochs >= 0:
            text += f"/{self.trainer.max_epochs - 1}"
        return f"{text:{len(self.validation_description)}}"

    def metrics_texts(self) -> list[str]:
        """The metrics as `name: value` texts, numbers in `theme.metrics_format`."""
        texts = []
        for name, value in self._metrics.items():
            if not isinstance(value, str):
                try:
                    value = f"{value:{self.theme.metrics_format}}"
                except (TypeError, ValueError):
                    value = str(value)
            texts.append(f"{name}: {value}")
        return texts

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print above the bars through rich's console (plain `print` when no bar is shown)."""
        if self.progress is None or self._stopped:
            print(*args, **kwargs)
            return
        self.progress.console.print(*args, sep=kwargs.get("sep", " "), end=kwargs.get("end", "\n"))

    # --- drawing ---------------------------------------------------------------------------------------------
    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import Progress

        console = Console(**self._console_kwargs)
        self.progress = Progress(*self.configure_columns(self.trainer), console=console, auto_refresh=False)
        self.progress.start()
        self._stopped = False
        self._ids, self._kind_ids = {}, {}

    def _draw(self) -> None:
        self._drawn_at = time.monotonic()
        self.progress.refresh()

    def _open(self, role: str, description: str, total: int | float) -> None:
        if self._stopped or (role == TRAIN and self._leave and TRAIN in self._ids):
            self._stop()  # with leave=True the finished epoch's bar stays on screen above the new one
            self._start()
        if self.theme.description:
            description = f"[{self.theme.description}]{description}"
        size = None if math.isinf(total) else total
        task = self._ids.get(role)
        if role == TRAIN and task is not None:
            self.progress.reset(task, total=size, description=description, visible=True)
        else:
            if task is not None:
                self.progress.update(task, visible=False)
            self._ids[role] = self.progress.add_task(description, total=size)
            if role != TRAIN:
                self._kind_ids[self._eval_kind()] = self._ids[role]
        self._draw()

    def _eval_kind(self) -> str:
        trainer = self.trainer
        if trainer.sanity_checking:
            return "sanity"
        return "test" if trainer.testing else "predict" if trainer.predicting else "val"

    def _advance(self, role: str, completed: int) -> bool:
        task = self._ids.get(role)
        if task is None or self._stopped:
            return False
        self.progress.update(task, completed=completed)
        if time.monotonic() - self._drawn_at < 1 / self._refresh_rate:
            return False
        if role == TRAIN:
            return True  # the base reads the metrics, and _show_metrics draws
        self._draw()
        return False

    def _show_metrics(self, metrics: dict[str, Any]) -> None:
        self._metrics = {k: v.item() if isinstance(v, Tensor) and v.numel() == 1 else v for k, v in metrics.items()}
        if not self._stopped and self.progress is not None:
            self._draw()

    def _close(self, role: str, hide: bool) -> None:
        task = self._ids.get(role)
        if task is None or self._stopped:
            return
        if hide:
            self.progress.update(task, visible=False)
        self._draw()

    def _stop(self) -> None:
        if self.progress is not None and not self._stopped:
            self.progress.stop()
        self._stopped = True

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["progress"] = None  # rich's Progress and Console hold locks, which do not pickle (ddp_spawn)
        state["_stopped"] = True
        return state
