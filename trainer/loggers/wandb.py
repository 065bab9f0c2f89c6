"""WandbLogger: metrics, config, files and checkpoints (as artifacts) to Weights & Biases, online or offline.

wandb is imported when the run starts, never by `import trainer`; the package comes with
`pip install "trainer[wandb]"`. Rank 0 starts the run and the other ranks learn its id, so only rank 0 talks to
wandb. Offline, everything (artifacts included) is written under `<save_dir>/wandb/offline-run-*` and uploaded
later by `wandb sync`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from strategies.comm.distributed import rank_zero_only
from trainer.loggers.artifacts import (
    changed_checkpoints,
    checkpoint_metadata,
    local_checkpoint,
    on_rank_zero,
    require,
)
from trainer.loggers.base import Logger

if TYPE_CHECKING:
    from callbacks.checkpoint import ModelCheckpoint

STEP_METRIC = "trainer/global_step"  # the x axis of every metric (wandb's own _step counts log calls)


class WandbLogger(Logger):
    """Log to Weights & Biases: metrics (x axis `trainer/global_step`), hyperparameters (the run config), files
    and checkpoints (model artifacts).

    Args:
        name: the run's display name.
        save_dir: the local folder wandb writes under (`<save_dir>/wandb/...`).
        version: the run id, to resume a run (same as `id`).
        offline: write the run locally only (upload later with `wandb sync`); nothing goes over the network.
        dir: same as `save_dir` (wandb's own name), used when `save_dir` is None.
        id: the run id (same as `version`).
        anonymous: log anonymously (wandb's `anonymous="allow"`).
        project: the project; default the `WANDB_PROJECT` environment variable, else "lightning_logs".
        log_model: `"all"`: a model artifact for every checkpoint ModelCheckpoint saves, when it saves it;
            `True`: the kept ones when the run ends (during the run too with `save_top_k=-1`); `False`: none.
            Offline too: the artifacts are uploaded by `wandb sync`.
        experiment: an existing wandb run to log to, instead of starting one.
        prefix: put before every metric name, joined with `-`.
        checkpoint_name: the model artifact's name (default `model-<run id>`).
        add_file_policy: how a checkpoint goes into its artifact: `"mutable"` (copied to W&B's staging area, the
            default) or `"immutable"` (the file itself, which must not change until the upload).
        **kwargs: passed to `wandb.init` (`entity`, `group`, `tags`, `mode`, ...).

    Raises:
        ModuleNotFoundError: wandb is not installed (the message names `pip install "trainer[wandb]"`).

    Example:
        ```python
        from trainer.loggers import WandbLogger

        logger = WandbLogger(project="digits", offline=True, log_model=True)
        Trainer(logger=logger, max_epochs=3).fit(model)
        ```
    """

    LOGGER_JOIN_CHAR = "-"
    """What joins `prefix` and a metric name."""

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike | None = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Literal["all"] | bool = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        add_file_policy: Literal["mutable", "immutable"] = "mutable",
        **kwargs: Any,
    ) -> None:
        require("wandb", "wandb", "WandbLogger")
        folder = save_dir if save_dir is not None else dir
        self._save_dir = os.fspath(folder) if folder is not None else None
        self._project = project or os.environ.get("WANDB_PROJECT", "lightning_logs")
        self._init: dict[str, Any] = {"name": name, "project": self._project, "dir": self._save_dir,
                                      "resume": "allow", **kwargs}
        if anonymous:
            self._init["anonymous"] = "allow"
        if offline:
            self._init["mode"] = "offline"
        self._offline = offline
        self._id: str | None = version or id or (getattr(experiment, "id", None) if experiment is not None else None)
        self._log_model = log_model
        self._prefix = prefix
        self._checkpoint_name = checkpoint_name
        self._add_file_policy = add_file_policy
        self._experiment = experiment
        self._owns_run = experiment is None  # a run the user passed in is theirs to finish
        self._callback: ModelCheckpoint | None = None
        self._uploaded: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:  # a spawned rank resumes the run by id instead of pickling it
        return {**self.__dict__, "_experiment": None}

    # --- the run ------------------------------------------------------------------------------------
    @property
    def experiment(self) -> Any:
        """The `wandb.Run` (rank 0 starts it on first use; a run finished by `finalize` is resumed by id)."""
        if self._experiment is None and on_rank_zero():
            import wandb

            if self._save_dir is not None:
                Path(self._save_dir).mkdir(parents=True, exist_ok=True)
            run = wandb.init(**{**self._init, "id": self._id})
            run.define_metric(STEP_METRIC)
            run.define_metric("*", step_metric=STEP_METRIC, step_sync=True)
            self._experiment, self._id = run, run.id
        return self._experiment

    @property
    def name(self) -> str:
        """The project (as Lightning's WandbLogger): the default checkpoint folder is named by it."""
        return self._project

    @property
    def version(self) -> str | None:  # None until rank 0 started the run
        """The run id (None before rank 0 started the run, if no id was given)."""
        return self._id

    @property
    def save_dir(self) -> str | None:
        """The local folder wandb writes under."""
        return self._save_dir

    @property
    def offline(self) -> bool:
        """Whether the run is written locally only (`wandb sync` uploads it later)."""
        return self._offline

    def identity(self) -> Any:
        if self._id is None:  # start the run to learn its id; a known id needs no run (e.g. after finalize)
            _ = self.experiment
        return self._id

    def adopt_identity(self, identity: Any) -> None:
        if identity is not None:
            self._id = identity

    # --- writing (rank 0 only: the base class gates these) ----------------------------------------------
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Into the run config (nested dicts stay nested; values that are not plain data become their repr)."""
        self.experiment.config.update(_plain(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Scalars; `step` goes in as `trainer/global_step`, every metric's x axis."""
        row = {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}" if self._prefix else k: v for k, v in metrics.items()}
        if step is not None:
            row[STEP_METRIC] = step
        self.experiment.log(row)

    # --- W&B's own objects (Lightning's WandbLogger methods; rank 0 only) ------------------------------------------
    @rank_zero_only
    def watch(self, model: Any, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True) -> None:
        """Have W&B record `model`'s gradients and/or parameters every `log_freq` steps (`wandb.Run.watch`)."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    @rank_zero_only
    def log_table(self, key: str, columns: list[Any] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None) -> None:
        """Log a `wandb.Table` of `columns` and `data` rows (or a pandas `dataframe`) under `key`."""
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    @rank_zero_only
    def log_text(self, key: str, columns: list[str] | None = None, data: list[list[str]] | None = None,
                 dataframe: Any = None, step: int | None = None) -> None:
        """Log text as a table (see `log_table`)."""
        self.log_table(key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: list[Any]) -> None:
        """Log images (tensors, arrays, PIL images or paths) under `key`; each keyword is a list with one value per
        image (e.g. `caption=[...]`) passed to its `wandb.Image`."""
        self._log_media(key, images, "Image", step, kwargs)

    @rank_zero_only
    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: list[Any]) -> None:
        """Log audio clips (arrays or paths), keywords per clip as in `log_image` (e.g. `sample_rate=[...]`)."""
        self._log_media(key, audios, "Audio", step, kwargs)

    @rank_zero_only
    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: list[Any]) -> None:
        """Log videos (arrays or paths), keywords per video as in `log_image` (e.g. `fps=[...]`)."""
        self._log_media(key, videos, "Video", step, kwargs)

    def _log_media(self, key: str, items: list[Any], kind: str, step: int | None, kwargs: dict[str, list[Any]]) -> None:
        if not isinstance(items, list):
            raise TypeError(f"WandbLogger.log_{kind.lower()}({key!r}, ...) takes a list of items, got a "
                            f"{type(items).__name__}.")
        for name, values in kwargs.items():
            if len(values) != len(items):
                raise ValueError(f"WandbLogger.log_{kind.lower()}: {name}= has {len(values)} values for "
                                 f"{len(items)} items; give one per item.")
        import wandb

        build = getattr(wandb, kind)
        self.log_metrics({key: [build(item, **{k: v[i] for k, v in kwargs.items()})
                                for i, item in enumerate(items)]}, step)

    def use_artifact(self, artifact: str, artifact_type: str | None = None) -> Any:
        """Declare `artifact` ("name:alias") an input of this run and return it (W&B's `use_artifact`; online)."""
        return self.experiment.use_artifact(artifact, type=artifact_type)

    @staticmethod
    def download_artifact(artifact: str, save_dir: str | os.PathLike | None = None,
                          artifact_type: str | None = None, use_artifact: bool | None = True) -> str:
        """Download `artifact` to `save_dir` and return the folder: through the running W&B run (recorded as its
        input) when there is one and `use_artifact`, else through W&B's public API (online)."""
        import wandb

        if use_artifact and wandb.run is not None:
            found = wandb.run.use_artifact(artifact, type=artifact_type)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        return str(found.download(root=os.fspath(save_dir) if save_dir is not None else None))

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy a local file into the run's files (uploaded with the run, or by `wandb sync` when offline)."""
        target = Path(self.experiment.dir, artifact_path or "", Path(local_path).name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(local_path).is_dir():
            shutil.copytree(local_path, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(local_path, target)

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._upload_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._callback = checkpoint_callback

    def finalize(self, status: str) -> None:
        """Log the pending checkpoints (log_model=True) and finish the run (exit code 0, or 1 if it failed).

        Finishing here (Lightning leaves it to the user) writes everything out before the process ends, which
        matters for ranks that end with os._exit; a later fit/test in the same process resumes the run by id.
        """
        if self._experiment is None:
            return
        if self._callback is not None and status == "success":
            self._upload_checkpoints(self._callback)
        if self._owns_run:
            self._experiment.finish(exit_code=0 if status == "success" else 1)
            self._experiment = None

    def _upload_checkpoints(self, callback: ModelCheckpoint) -> None:
        import wandb

        for path in changed_checkpoints(callback, self._uploaded):
            artifact = wandb.Artifact(self._checkpoint_name or f"model-{self.experiment.id}", type="model",
                                      metadata=checkpoint_metadata(callback, path))
            with local_checkpoint(path) as local:
                if Path(local).is_dir():  # a sharded checkpoint folder
                    artifact.add_dir(local, name="model.ckpt")
                else:
                    artifact.add_file(local, name="model.ckpt", policy=self._add_file_policy)
                aliases = ["latest", "best"] if path == callback.best_model_path else ["latest"]
                self.experiment.log_artifact(artifact, aliases=aliases)  # add_file copied it to wandb's staging


def _plain(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            out[key] = _plain(value)
        elif value is None or isinstance(value, (int, float, str, bool)):
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str, bool)) for v in value):
            out[key] = list(value)
        else:
            out[key] = repr(value)
    return out
