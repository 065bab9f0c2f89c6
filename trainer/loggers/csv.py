"""CSVLogger: `metrics.csv` (a row per logged step, columns sorted, the file appended to) and `hparams.yaml`, written
by its `ExperimentWriter` (Lightning's `logger.experiment`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.filesystem import exists, join, makedirs, open_file, to_path
from strategies.comm.distributed import rank_zero_warn
from trainer.loggers.base import VersionedFolderLogger, add_prefix, rank_zero_experiment
from trainer.loggers.hparams_file import params_dict, write_hparams_yaml


class ExperimentWriter:
    """Writes a CSV run's files in `log_dir`: `hparams.yaml` at each `log_hparams`, and the rows `log_metrics`
    collected to `metrics.csv` at each `save` (appended; the file is rewritten only when new columns appear, with
    every column, sorted, in the header). An old `metrics.csv` in `log_dir` is removed with a warning (a run given
    an existing version starts a fresh file).

    Args:
        log_dir: the run's folder, local or an fsspec URL.
    """

    NAME_HPARAMS_FILE = "hparams.yaml"
    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, log_dir: str) -> None:
        self.hparams: dict[str, Any] = {}
        self.metrics: list[dict[str, Any]] = []  # rows logged since the last save
        self.metrics_keys: list[str] = []  # the file's columns, sorted
        self.log_dir = log_dir
        self.metrics_file_path = str(join(to_path(log_dir), self.NAME_METRICS_FILE))
        self._check_log_dir_exists()
        makedirs(to_path(log_dir))

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        """Add `params` to the recorded hyperparameters and rewrite `hparams.yaml` with all of them."""
        self.hparams.update(params)
        write_hparams_yaml(join(to_path(self.log_dir), self.NAME_HPARAMS_FILE), self.hparams)

    def log_metrics(self, metrics_dict: Mapping[str, Any], step: int | None = None) -> None:
        """Keep a row (tensors as numbers) with its `step` (default: the number of rows kept)."""
        row = {key: value.item() if hasattr(value, "item") else value for key, value in metrics_dict.items()}
        row["step"] = len(self.metrics) if step is None else step
        self.metrics.append(row)

    def save(self) -> None:
        """Write the kept rows to `metrics.csv` and forget them."""
        if not self.metrics:
            return
        path = to_path(self.metrics_file_path)
        new = {key for row in self.metrics for key in row} - set(self.metrics_keys)
        self.metrics_keys = sorted({*self.metrics_keys, *new})
        if exists(path) and (new or not isinstance(path, Path)):  # an object store cannot append: rewrite it
            with open_file(path, "r") as handle:
                previous = list(csv.DictReader(io.StringIO(handle.read())))
            self._write(path, "w", previous + self.metrics)
        else:
            self._write(path, "a" if exists(path) else "w", self.metrics)
        self.metrics = []

    def _write(self, path: Any, mode: str, rows: list[dict[str, Any]]) -> None:
        with open_file(path, mode) as handle:
            writer = csv.DictWriter(handle, fieldnames=self.metrics_keys)
            if mode == "w":
                writer.writeheader()
            writer.writerows(rows)

    def _check_log_dir_exists(self) -> None:
        """An earlier run's `metrics.csv` here (a version given again) is replaced, with Lightning's warning. Other
        files (the CLI's config.yaml, written into the run folder before the first metric) are left alone."""
        metrics = to_path(self.metrics_file_path)
        if exists(metrics):
            rank_zero_warn(f"Experiment logs directory {self.log_dir} exists and is not empty. Previous log files "
                           "in this directory will be deleted when the new ones are saved!")
            from strategies.checkpoint_io.catalog import remove_checkpoint

            remove_checkpoint(metrics)  # a plain delete, local or on a store


class CSVLogger(VersionedFolderLogger):
    """Writes `save_dir/name/version_N/metrics.csv` and `hparams.yaml` (plain text, no extra deps).

    Args:
        save_dir: the root folder, local or an fsspec URL (`s3://bucket/logs`: each save rewrites the object).
        name: the experiment folder under `save_dir` (None or "": the versions go straight under `save_dir`).
        version: None picks the next free `version_N`; an int N means `version_N`; a string is the folder name.
        prefix: put before every metric key, joined with `-`.
        flush_logs_every_n_steps: write the kept rows to the file after logging step `k * n - 1` (Lightning's
            rule), and at every `save` (the Trainer saves at the end of each epoch and of the run).
    """

    def __init__(self, save_dir: str | Path, name: str | None = "csv_logs", version: int | str | None = None,
                 prefix: str = "", flush_logs_every_n_steps: int = 100) -> None:
        super().__init__(save_dir, name, version, prefix)
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self._experiment: ExperimentWriter | None = None

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The ExperimentWriter of this run (made on first use, on rank 0; other ranks get a do-nothing stand-in)."""
        if self._experiment is None:
            makedirs(to_path(self.root_dir))
            self._experiment = ExperimentWriter(log_dir=self.log_dir)
        return self._experiment

    @property
    def metrics_file(self) -> str:
        """`log_dir/metrics.csv` (a URL when `save_dir` is one)."""
        return str(join(to_path(self.log_dir), ExperimentWriter.NAME_METRICS_FILE))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Keep a row: `step`, then one column per key (a new key adds a column to the whole file)."""
        metrics = add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        if step is None:
            step = len(self.experiment.metrics)
        self.experiment.log_metrics(metrics, step)
        if (step + 1) % self.flush_logs_every_n_steps == 0:
            self.save()

    def log_hyperparams(self, params: Any = None) -> None:
        """Write `hparams.yaml` (nested mappings stay nested); a Namespace or omegaconf config is read as a dict."""
        self.experiment.log_hparams(params_dict(params))

    def save(self) -> None:
        """Write the rows kept so far to metrics.csv."""
        self.experiment.save()

    def finalize(self, status: str) -> None:
        if self._experiment is not None:  # nothing was logged: no file to write
            self.save()
