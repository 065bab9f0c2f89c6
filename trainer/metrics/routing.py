"""Where logged values go: `callback_metrics`, `logged_metrics`, `progress_bar_metrics` and the
loggers. Owns the `log_every_n_steps` cadence, and reads step values lazily so that a run that logs
every step pays no device sync until a logger or the progress bar asks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from trainer.core.hparams import hparams_for_loggers, logs_hparams
from trainer.metrics.results import ResultCollection, to_python
from trainer.state import Progress


class MetricsRouter:
    """Merges what the running loops logged into the three user-visible dicts, and feeds loggers."""

    def __init__(self, log_every_n_steps: int, progress: Progress) -> None:
        self.log_every_n_steps = log_every_n_steps
        self._progress = progress
        self.loggers: Sequence[Any] = ()
        self._callback: dict[str, Tensor] = {}
        self._logged: dict[str, Any] = {}  # tensors, and the floats a callback computed (send_computed)
        self._progress_bar: dict[str, Tensor] = {}
        self._live: ResultCollection | None = None  # the train results whose step values are current
        self._stepped_now = False  # the last training batch closed an accumulation window

    def reset(self) -> None:
        self._callback.clear()
        self._logged.clear()
        self._progress_bar.clear()
        self._live = None
        self._stepped_now = False

    def watch(self, results: ResultCollection | None) -> None:
        """Step values of `results` show up in callback/progress-bar metrics until the next watch()."""
        if self._live is not None and self._live is not results:
            self._persist_live()
        self._live = results

    def _persist_live(self) -> None:
        assert self._live is not None
        self._callback.update(self._live.step_metrics("callback"))
        self._progress_bar.update(self._live.step_metrics("prog_bar"))
        self._logged.update(self._live.step_metrics("logger"))

    # --- what users read --------------------------------------------------------------------------
    @property
    def callback_metrics(self) -> dict[str, Tensor]:
        if self._live is None:
            return dict(self._callback)
        return {**self._callback, **self._live.step_metrics("callback")}

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        merged = dict(self._progress_bar)
        if self._live is not None:
            merged.update(self._live.step_metrics("prog_bar"))
        return to_python(merged)

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """Every value logged with `logger=True` (its latest step and epoch values), as tensors, whether or not a
        logger is attached or the `log_every_n_steps` cadence sent it, as Lightning keeps them."""
        if self._live is None:
            return dict(self._logged)
        return {**self._logged, **self._live.step_metrics("logger")}

    def log_hyperparams(self, module: Any, datamodule: Any) -> None:
        """At fit start, as Lightning: every logger gets the module's and datamodule's `hparams_initial`
        (trainer/core/hparams.py; possibly empty), then `log_graph(module)`, then `save()`."""
        params = hparams_for_loggers(module, datamodule)
        send = logs_hparams(module, datamodule)
        for logger in self.loggers:
            if send:
                logger.log_hyperparams(params)
            logger.log_graph(module)
            logger.save()

    def state_dict(self) -> dict[str, Any]:
        return {"callback": self.callback_metrics, "logged": self.logged_metrics}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._callback.update(state.get("callback", {}))
        self._logged.update(state.get("logged", {}))

    def to_cpu(self) -> None:
        """At the end of a run, as Lightning: the metrics users read after it live on the CPU (no device memory held,
        nothing to synchronise when they are read)."""
        if self._live is not None:
            self._persist_live()
            self._live = None
        for values in (self._callback, self._logged, self._progress_bar):
            for key, value in values.items():
                if isinstance(value, Tensor) and value.device.type != "cpu":
                    values[key] = value.cpu()

    def adopt(self, callback: dict[str, Tensor], logged: dict[str, Any]) -> None:
        """Take over the metrics a rank in another process produced (ddp_spawn)."""
        self._live = None
        self._callback, self._logged = dict(callback), dict(logged)

    # --- the logging cadence ----------------------------------------------------------------------
    def log_due(self, stepped: int) -> bool:
        """Does the `stepped`-th batch that steps the optimizer send its step values to the loggers?

        Lightning's count: batches that closed an accumulation window (optimizer steps with one optimizer; every
        batch in manual optimization), not batches: with accumulate_grad_batches=4 and log_every_n_steps=2,
        every 8th batch. 0 never logs at steps.
        """
        n = self.log_every_n_steps
        return bool(self.loggers) and n > 0 and stepped % n == 0

    @property
    def batch_starting_logs(self) -> bool:
        """In `on_train_batch_start`: will the next optimizer step's values reach the loggers? (Lightning asks the
        same question at every batch of the window that step closes.)"""
        return self.log_due(self._progress.stepped_batches + 1)

    def send_measured(self, values: dict[str, float], step: int) -> None:
        """Send values a callback measured itself (not `self.log` values) to the loggers at `step`.

        They stay out of `logged_metrics`, as a Lightning callback writing to its loggers does.
        """
        for logger in self.loggers:
            logger.log_metrics(values, step=step)

    def add_callback_metrics(self, values: dict[str, Tensor]) -> None:
        """Values a callback measured that other callbacks may monitor (LearningRateMonitor's `lr-*`): they join
        `callback_metrics` only, as in Lightning."""
        self._callback.update(values)

    def send_computed(self, values: dict[str, float], step: int) -> None:
        """Send values a callback computed to the loggers and into `logged_metrics` (Lightning's
        `trainer._logger_connector.log_metrics`, which ThroughputMonitor logs through); nothing without a logger."""
        if self.loggers and values:
            self._send(values, step, None)

    # --- updates from the loops -------------------------------------------------------------------
    def step_end(self, results: ResultCollection, stepped: bool, epoch: int, stopping: bool = False) -> None:
        """After each training batch (`stepped`: it closed an accumulation window): send its step values to the
        loggers when the cadence says so, or when a stop was requested (`should_stop`, as Lightning), at Lightning's
        step: the number of stepping batches before this one."""
        self._stepped_now = stepped
        if not stepped:
            return
        count = self._progress.stepped_batches + 1
        self._progress.stepped_batches = count
        if not self.loggers or not (self.log_due(count) or (stopping and self.log_every_n_steps > 0)):
            return  # no logger: nothing goes out at any step (one check, no call)
        values = results.step_metrics("logger")
        if values:
            self._send(values, count - 1, epoch)

    def eval_step_end(self, results: ResultCollection, step: int) -> None:
        """After each validation/test batch (not the sanity check's): its step values (`self.log(..., on_step=True)`
        in validation_step, test_step and their batch hooks) go to the loggers at once, at `step`, the batches of
        that loader seen so far, as Lightning's `val_loss_step` rows do (no `log_every_n_steps`, no `epoch` key)."""
        self._progress_bar.update(results.step_metrics("prog_bar"))
        values = results.step_metrics("logger")
        if values:
            self._logged.update(values)
            for logger in self.loggers:
                logger.log_metrics(to_python(values), step=step)

    def train_batch_starts(self) -> None:
        """A training batch begins: the batch before it is done (see `logging_step`)."""
        self._stepped_now = False

    @property
    def logging_step(self) -> int:
        """The step a value sent now goes out at, as Lightning's: the batches that stepped the optimizer before the
        current training batch, which the validation after a batch shares with that batch's step values (Lightning
        counts a batch once everything after it ran). Used for validation values and by callbacks that send their
        own values (ThroughputMonitor, DeviceStatsMonitor)."""
        return self._progress.stepped_batches - self._stepped_now

    @property
    def train_epoch_step(self) -> int:
        """Lightning's step for training epoch-end values: the step of the epoch's last step values."""
        return self._progress.stepped_batches - 1

    def settle_step_values(self) -> None:
        """At a training epoch's end: its last step values are recorded as they stand, and the results forget them,
        so the epoch values computed next take their place where both have a key (Lightning's order)."""
        if self._live is not None:
            self._persist_live()
            self._live.clear_step_values()

    def epoch_end(self, computed: dict[str, dict[str, Tensor]], step: int, epoch: int | None) -> None:
        """Record epoch values (from ResultCollection.epoch_end) and send them to the loggers."""
        if self._live is not None:  # the bar lists names in the order they were first logged, as Lightning's does
            for key, value in self._live.step_metrics("prog_bar").items():
                self._progress_bar.setdefault(key, value)
        self._callback.update(computed["callback"])
        self._progress_bar.update(computed["prog_bar"])
        values = computed["logger"]
        if values:
            self._send(values, step, epoch)

    def _send(self, values: dict[str, Any], step: int, epoch: int | None) -> None:
        """Record `values` in `logged_metrics` (without `epoch`, as Lightning's) and send them as numbers to the
        loggers, with the `epoch` key when given."""
        self._logged.update(values)
        if not self.loggers:
            return
        scalars = to_python(values)
        if epoch is not None:
            scalars["epoch"] = epoch
        for logger in self.loggers:
            logger.log_metrics(scalars, step=step)
            logger.save()  # as Lightning: a CSV row reaches metrics.csv when it is logged, not 100 steps later
