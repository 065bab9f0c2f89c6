"""MLFlowLogger: metrics, hyperparameters, tags, files and checkpoints to an MLflow tracking server or store.

mlflow is imported when the logger first talks to the tracking store, never by `import trainer`; the package
comes with `pip install "trainer[mlflow]"`. The run is created by rank 0 when a run starts (or taken over with
`run_id=`), and the other ranks learn its ids from rank 0, so only rank 0 ever contacts the server.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from strategies.comm.distributed import rank_zero_warn
from trainer.loggers.artifacts import (
    changed_checkpoints,
    checkpoint_metadata,
    local_checkpoint,
    on_rank_zero,
    require,
)
from trainer.loggers.base import Logger, flatten_hparams

if TYPE_CHECKING:
    from callbacks.checkpoint import ModelCheckpoint

_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
_BAD_KEY_CHARS = re.compile(r"[^a-zA-Z0-9_\-./ :]")  # what MLflow accepts in a metric name
_METRICS_PER_BATCH, _PARAMS_PER_BATCH = 1000, 100  # MLflow's log_batch limits


class MLFlowLogger(Logger):
    """Log to MLflow: metrics, hyperparameters (as params), tags, the CLI's config and checkpoints (artifacts).

    Args:
        experiment_name: the experiment, created if it does not exist.
        run_name: the new run's name (MLflow's `mlflow.runName` tag).
        tracking_uri: the tracking server or store, e.g. `http://127.0.0.1:5000`. Default: the
            `MLFLOW_TRACKING_URI` environment variable, else a SQLite store `sqlite:///<save_dir>/mlflow.db`
            (MLflow 3 refuses the old `file:` store).
        tags: tags set on a new run.
        save_dir: the local folder of the default SQLite store and its artifacts (unused with `tracking_uri`).
        log_model: `"all"`: upload every checkpoint ModelCheckpoint saves, when it saves it; `True`: upload the
            kept ones (top-k, best, last) when the run ends (during the run too with `save_top_k=-1`); `False`: none.
        prefix: put before every metric name, joined with `-`.
        artifact_location: where a new experiment keeps its artifacts (the server decides when None).
        run_id: resume this run instead of creating one (its experiment is the run's own).
        synchronous: MLflow's `synchronous` flag of `log_batch` (None: MLflow's default, blocking).
        checkpoint_path_prefix: artifact folder the checkpoints go under.

    Raises:
        ModuleNotFoundError: mlflow is not installed (the message names `pip install "trainer[mlflow]"`).

    Example:
        ```python
        from trainer.loggers import MLFlowLogger

        logger = MLFlowLogger(experiment_name="digits", tracking_uri="http://127.0.0.1:5000", log_model=True)
        Trainer(logger=logger, max_epochs=3).fit(model)
        ```
    """

    LOGGER_JOIN_CHAR = "-"
    """What joins `prefix` and a metric name."""

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, Any] | None = None,
        save_dir: str | None = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
        checkpoint_path_prefix: str = "",
    ) -> None:
        require("mlflow", "mlflow", "MLFlowLogger")
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self._local_root: str | None = None
        if not tracking_uri:  # a local store in save_dir
            self._local_root = str(Path(save_dir or "./mlruns").resolve())
            tracking_uri = f"sqlite:///{self._local_root}/mlflow.db"
            artifact_location = artifact_location or Path(self._local_root, "artifacts").as_uri()
        self._tracking_uri = tracking_uri
        self._experiment_name = experiment_name
        self._run_name = run_name
        self.tags = dict(tags or {})
        self._log_model = log_model
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._run_id = run_id
        self._experiment_id: str | None = None
        self._batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._checkpoint_path_prefix = checkpoint_path_prefix
        self._client: Any = None
        self._callback: ModelCheckpoint | None = None
        self._uploaded: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:  # a spawned rank makes its own client
        return {**self.__dict__, "_client": None}

    # --- the run ------------------------------------------------------------------------------------
    @property
    def experiment(self) -> Any:
        """The `mlflow.tracking.MlflowClient` (on rank 0 the experiment and run exist once this returns)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(self._tracking_uri)
        if on_rank_zero() and (self._run_id is None or self._experiment_id is None):
            self._create_or_resume_run()
        return self._client

    def _create_or_resume_run(self) -> None:
        client = self._client
        if self._run_id is not None:
            self._experiment_id = client.get_run(self._run_id).info.experiment_id
            return
        experiment = client.get_experiment_by_name(self._experiment_name)
        self._experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(
            self._experiment_name, artifact_location=self._artifact_location)
        tags = {str(k): str(v) for k, v in self.tags.items()}
        if self._run_name is not None:
            tags["mlflow.runName"] = self._run_name
        self._run_id = client.create_run(self._experiment_id, tags=tags).info.run_id

    @property
    def run_id(self) -> str | None:
        """The run's id (rank 0 creates the run on first use)."""
        if on_rank_zero():
            _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id (rank 0 creates it on first use)."""
        if on_rank_zero():
            _ = self.experiment
        return self._experiment_id

    @property
    def name(self) -> str | None:  # None on other ranks until rank 0 made the run
        """The experiment id (as Lightning's MLFlowLogger): the default checkpoint folder is named by it."""
        return self.experiment_id

    @property
    def version(self) -> str | None:  # None on other ranks until rank 0 made the run
        """The run id."""
        return self.run_id

    @property
    def save_dir(self) -> str | None:
        """The local folder of the default SQLite store, or None with a tracking server."""
        return self._local_root

    def identity(self) -> Any:
        return {"experiment_id": self.experiment_id, "run_id": self.run_id}

    def adopt_identity(self, identity: Any) -> None:
        if identity:
            self._experiment_id, self._run_id = identity["experiment_id"], identity["run_id"]

    # --- writing (rank 0 only: the base class gates these) ----------------------------------------------
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Hyperparameters as MLflow params (nested dicts flattened to `a/b`, values as strings)."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        flat = [Param(k, str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in flatten_hparams(params).items()]
        for start in range(0, len(flat), _PARAMS_PER_BATCH):
            self.experiment.log_batch(self.run_id, params=flat[start:start + _PARAMS_PER_BATCH], **self._batch_kwargs)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Scalars at `step`; names get `prefix` and lose characters MLflow refuses (with a warning)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            if isinstance(value, str):
                rank_zero_warn(f"MLFlowLogger: not logging the string metric {key}={value!r}.")
                continue
            name = f"{self._prefix}{self.LOGGER_JOIN_CHAR}{key}" if self._prefix else key
            clean = _BAD_KEY_CHARS.sub("", name)
            if clean != name:
                rank_zero_warn(f"MLFlowLogger: MLflow refuses some characters of the metric {name!r}; logged as "
                               f"{clean!r}.")
            batch.append(Metric(clean, float(value), now, step or 0))
        for start in range(0, len(batch), _METRICS_PER_BATCH):
            self.experiment.log_batch(self.run_id, metrics=batch[start:start + _METRICS_PER_BATCH],
                                      **self._batch_kwargs)

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Upload a local file (or folder) to the run's artifacts."""
        if Path(local_path).is_dir():
            self.experiment.log_artifacts(self.run_id, local_path, artifact_path)
        else:
            self.experiment.log_artifact(self.run_id, local_path, artifact_path)

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._upload_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._callback = checkpoint_callback

    def finalize(self, status: str) -> None:
        """Upload the pending checkpoints (log_model=True) and mark the run FINISHED or FAILED."""
        if self._client is None or self._run_id is None:
            return  # nothing was ever logged
        if self._callback is not None:
            self._upload_checkpoints(self._callback)
        self.experiment.set_terminated(self._run_id, _STATUS.get(status, "FINISHED"))

    def _upload_checkpoints(self, callback: ModelCheckpoint) -> None:
        """Each new or rewritten checkpoint to `<checkpoint_path_prefix>/<stem>/` with a metadata.json beside it."""
        for path in changed_checkpoints(callback, self._uploaded):
            folder = Path(self._checkpoint_path_prefix, Path(path.rstrip("/")).stem).as_posix()
            with local_checkpoint(path) as local:
                self.log_artifact(local, folder if Path(local).is_file() else f"{folder}/{Path(local).name}")
            with tempfile.TemporaryDirectory() as tmp:
                meta = Path(tmp, "metadata.json")
                meta.write_text(json.dumps(checkpoint_metadata(callback, path), indent=1))
                self.log_artifact(str(meta), folder)
