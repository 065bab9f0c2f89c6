"""CSVLogger: metrics.csv (one row per step, columns grow as new keys appear) and hparams.yaml."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.filesystem import AnyPath, join, makedirs, open_file, to_path
from trainer.loggers.base import VersionedFolderLogger, flatten_hparams


class CSVLogger(VersionedFolderLogger):
    """Writes `save_dir/name/version_N/metrics.csv` and `hparams.yaml` (plain text, no extra deps).

    Args:
        save_dir: the root folder, local or an fsspec URL (`s3://bucket/logs`: each save rewrites the object).
        name: the experiment folder under `save_dir`.
        version: None picks the next free `version_N`; an int N means `version_N`; a string is the folder name.
        flush_logs_every_n_steps: rows kept in memory before metrics.csv is rewritten (also at save and the end).
    """

    def __init__(self, save_dir: str | Path, name: str = "csv_logs", version: int | str | None = None,
                 flush_logs_every_n_steps: int = 100) -> None:
        super().__init__(save_dir, name, version)
        self.flush_every = flush_logs_every_n_steps
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._written = 0

    @property
    def metrics_file(self) -> AnyPath:
        """`log_dir/metrics.csv` (a URL when `save_dir` is one)."""
        return join(to_path(self.log_dir), "metrics.csv")

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Add a row: `step`, then one column per key (a new key adds a column to the whole file)."""
        row = {"step": step, **metrics}
        self._rows.append(row)
        for key in row:
            if key not in self._columns:
                self._columns.append(key)
        if len(self._rows) - self._written >= self.flush_every:
            self.save()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Write `hparams.yaml`, nested dicts flattened to `a/b` keys."""
        folder = to_path(self.log_dir)
        makedirs(folder)
        lines = [f"{key}: {value!r}" if isinstance(value, str) else f"{key}: {value}"
                 for key, value in flatten_hparams(params).items()]
        with open_file(join(folder, "hparams.yaml"), "w") as handle:
            handle.write("\n".join(lines) + "\n")

    def save(self) -> None:
        """Rewrite metrics.csv with every row so far (columns may have grown since the last write)."""
        if not self._rows:
            return
        makedirs(to_path(self.log_dir))
        with open_file(self.metrics_file, "w") as handle:
            writer = csv.DictWriter(handle, fieldnames=self._columns)
            writer.writeheader()
            writer.writerows(self._rows)
        self._written = len(self._rows)
