"""TensorBoardLogger: scalars and hparams to `save_dir/name/version_N` (tensorboard imported lazily)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.filesystem import makedirs, to_path
from trainer.loggers.base import VersionedFolderLogger, flatten_hparams


class TensorBoardLogger(VersionedFolderLogger):
    """Writes TensorBoard event files. `version=None` picks the next free `version_N`.

    tensorboard is imported on the first write, so `import trainer` stays light.

    Args:
        save_dir: the root folder, local or a URL (tensorboard's own file layer writes it: s3:// through boto3,
            other protocols through fsspec).
        name: the experiment folder under `save_dir`.
        version: None picks the next free `version_N`; an int N means `version_N`; a string is the folder name.
        default_hp_metric: also write Lightning's placeholder `hp_metric` (-1) with the hyperparameters.
    """

    def __init__(self, save_dir: str | Path, name: str = "runs", version: int | str | None = None,
                 default_hp_metric: bool = False) -> None:
        super().__init__(save_dir, name, version)
        self._experiment: Any = None
        self.default_hp_metric = default_hp_metric
        self.hparams: dict[str, Any] = {}

    @property
    def experiment(self) -> Any:
        """The torch SummaryWriter, created on first use (importing tensorboard costs ~1 s)."""
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            makedirs(to_path(self.log_dir))
            self._experiment = SummaryWriter(log_dir=self.log_dir)
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """One scalar per key at `step`; the `epoch` key is written only when logged alone."""
        for key, value in metrics.items():
            if key == "epoch" and len(metrics) > 1:
                continue
            self.experiment.add_scalar(key, value, global_step=step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Write the hyperparameters (flattened to `a/b` keys) for TensorBoard's HPARAMS tab."""
        self.hparams.update(flatten_hparams(params))
        from torch.utils.tensorboard.summary import hparams

        metrics = {"hp_metric": -1} if self.default_hp_metric else {}
        exp, ssi, sei = hparams(self.hparams, metrics)
        writer = self.experiment._get_file_writer()
        for summary in (exp, ssi, sei):
            writer.add_summary(summary)

    def save(self) -> None:
        if self._experiment is not None:
            self._experiment.flush()

    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            self._experiment.flush()
            self._experiment.close()
            self._experiment = None
