"""TensorBoardLogger: scalars, hyperparameters (with `hp_metric`), the model graph and `hparams.yaml` in
`save_dir/name/version_N[/sub_dir]` (tensorboard imported lazily)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.filesystem import exists, join, makedirs, to_path
from strategies.comm.distributed import rank_zero_warn
from trainer.loggers.base import VersionedFolderLogger, add_prefix, flatten_hparams, rank_zero_experiment
from trainer.loggers.hparams_file import params_dict, write_hparams_yaml


class TensorBoardLogger(VersionedFolderLogger):
    """Writes TensorBoard event files. `version=None` picks the next free `version_N`.

    tensorboard is imported on the first write, so `import trainer` stays light.

    Args:
        save_dir: the root folder, local or a URL (tensorboard's own file layer writes it: s3:// through boto3,
            other protocols through fsspec).
        name: the experiment folder under `save_dir` (None or "": the versions go straight under `save_dir`).
        version: None picks the next free `version_N`; an int N means `version_N`; a string is the folder name.
        log_graph: draw the module's graph at fit start (from `example_input_array`, or `log_graph(model, input)`).
        default_hp_metric: with hyperparameters logged without metrics, also log Lightning's placeholder
            `hp_metric` (-1), so TensorBoard's HPARAMS tab shows the run.
        prefix: put before every metric key, joined with `-`.
        sub_dir: a folder inside the version folder for the event files (`~` and `$VARS` expanded).
        **kwargs: passed to `torch.utils.tensorboard.SummaryWriter` (e.g. `max_queue`, `flush_secs`).
    """

    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir: str | Path, name: str | None = "runs", version: int | str | None = None,
                 log_graph: bool = False, default_hp_metric: bool = True, prefix: str = "",
                 sub_dir: str | Path | None = None, **kwargs: Any) -> None:
        super().__init__(save_dir, name, version, prefix)
        self._experiment: Any = None
        self._log_graph = log_graph
        self._default_hp_metric = default_hp_metric
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs
        self.hparams: dict[str, Any] = {}

    @property
    def default_hp_metric(self) -> bool:
        """Whether hyperparameters logged without metrics come with the placeholder `hp_metric=-1`."""
        return self._default_hp_metric

    @property
    def sub_dir(self) -> str | None:
        """The folder inside the version folder that holds the event files, or None."""
        return self._sub_dir

    @property
    def log_dir(self) -> str:
        folder = super().log_dir
        if self.sub_dir is not None:
            folder = str(join(to_path(folder), self.sub_dir))
        return os.path.expanduser(os.path.expandvars(folder))

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The torch SummaryWriter, created on first use on rank 0 (importing tensorboard costs ~1 s)."""
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            makedirs(to_path(self.log_dir))
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._kwargs)
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """One scalar per key at `step` (a dict value: one chart of several scalars)."""
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if hasattr(value, "item"):
                value = value.item()
            if isinstance(value, Mapping):
                self.experiment.add_scalars(key, value, step)
                continue
            try:
                self.experiment.add_scalar(key, value, step)
            except Exception as error:
                raise ValueError(f"TensorBoardLogger cannot log {key}={value!r}: log a number, a scalar tensor or a "
                                 "dict of them.") from error

    def log_hyperparams(self, params: Any, metrics: Any = None, step: int | None = None) -> None:
        """Record the hyperparameters (flattened to `a/b` keys) for TensorBoard's HPARAMS tab, with `metrics` (a
        dict, or one value shown as `hp_metric`); without metrics, `hp_metric=-1` when `default_hp_metric`. They
        also go to `hparams.yaml` at the next `save`."""
        params = params_dict(params)
        self.hparams.update(params)
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else None
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if not metrics:
            return
        self.log_metrics(metrics, step)
        from torch.utils.tensorboard.summary import hparams

        shown = {k: v.item() if hasattr(v, "item") and getattr(v, "numel", lambda: 0)() == 1 else v
                 for k, v in metrics.items()}
        exp, ssi, sei = hparams(flatten_hparams(params), shown)
        writer = self.experiment._get_file_writer()
        for summary in (exp, ssi, sei):
            writer.add_summary(summary, step)

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Draw `model`'s graph for `input_array` (default: its `example_input_array`), when `log_graph=True`."""
        if not self._log_graph:
            return
        example = getattr(model, "example_input_array", None) if input_array is None else input_array
        if example is None:
            rank_zero_warn("Could not log computational graph to TensorBoard: The `model.example_input_array` "
                           "attribute is not set or `input_array` was not given.")
            return
        import torch

        if not isinstance(example, (torch.Tensor, tuple)):
            rank_zero_warn(f"Could not log computational graph to TensorBoard: the input has type {type(example)} "
                           "which can't be traced by TensorBoard: give a tensor, or a tuple of forward()'s positional "
                           "arguments.")
            return
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        moved = tuple(x.to(device) for x in example) if isinstance(example, tuple) else example.to(device)
        self.experiment.add_graph(model, moved)

    def save(self) -> None:
        """Flush the events, and write `hparams.yaml` into the run folder once it exists (not again after)."""
        if self._experiment is not None:
            self._experiment.flush()
        folder = to_path(self.log_dir)
        path = join(folder, self.NAME_HPARAMS_FILE)
        if exists(folder) and not exists(path):
            write_hparams_yaml(path, self.hparams)

    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            self._experiment.flush()
            self._experiment.close()
            self._experiment = None
        if status == "success":
            self.save()
