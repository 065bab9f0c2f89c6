"""MLFlowLogger against a real MLflow tracking server (SQLite backend store, artifacts served by the server),
started once for this module on 127.0.0.1; everything is read back through the mlflow client."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from trainer import Trainer
from trainer.loggers import CSVLogger

mlflow = pytest.importorskip("mlflow", reason="MLFlowLogger needs mlflow: pip install -e '.[mlflow]' (in .[dev])")
from trainer.loggers import MLFlowLogger  # noqa: E402

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(300)]  # a real MLflow server: 15-40 s to start
FIT = {**QUIET, "max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0,
       "log_every_n_steps": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.helpers.servers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as running:
        yield running.url


@pytest.fixture
def client(server):
    from mlflow.tracking import MlflowClient

    return MlflowClient(server)


class Logs(BoringModel):
    def __init__(self, lr: float = 0.1, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(32, width)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)
        return loss


def _fit(server: str, root: Path, **logger_args: Any) -> tuple[Trainer, MLFlowLogger, Logs]:
    logger = MLFlowLogger(tracking_uri=server, **logger_args)
    trainer = Trainer(**{**FIT, "logger": logger, "enable_checkpointing": True, "default_root_dir": root})
    model = Logs(width=3)
    trainer.fit(model)
    return trainer, logger, model


def test_metrics_params_tags_and_status_read_back(server, client, tmp_path):
    _, logger, _ = _fit(server, tmp_path, experiment_name="read-back", run_name="first", tags={"team": "core"})
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert run.data.params == {"lr": "0.1", "width": "3"}
    assert run.data.tags["team"] == "core"
    history = client.get_metric_history(logger.run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3]  # Lightning's step: the optimizer steps before this one
    assert run.data.metrics["val_loss"] == pytest.approx(client.get_metric_history(logger.run_id, "val_loss")[-1]
                                                         .value)


def test_checkpoint_folder_follows_the_folder_contract(server, tmp_path):
    trainer, logger, _ = _fit(server, tmp_path, experiment_name="folders")
    assert trainer.log_dir == str(tmp_path)  # no folder of its own: the run's files go under default_root_dir
    expected = tmp_path / logger.experiment_id / logger.run_id / "checkpoints"
    assert trainer.checkpoint_callback.dirpath == str(expected)
    assert (expected / "epoch=1-step=4.ckpt").is_file()


def test_checkpoints_uploaded_as_artifacts_load_back(server, client, tmp_path):
    trainer, logger, model = _fit(server, tmp_path, experiment_name="artifacts", log_model=True)
    listed = [a.path for a in client.list_artifacts(logger.run_id, "epoch=1-step=4")]
    assert sorted(listed) == ["epoch=1-step=4/epoch=1-step=4.ckpt", "epoch=1-step=4/metadata.json"]
    local = client.download_artifacts(logger.run_id, "epoch=1-step=4/epoch=1-step=4.ckpt", str(tmp_path / "dl"))
    loaded = Logs.load_from_checkpoint(local)
    assert torch.equal(loaded.layer.weight, model.layer.weight)


def test_log_model_all_uploads_every_checkpoint_when_saved(server, client, tmp_path):
    logger = MLFlowLogger(tracking_uri=server, experiment_name="all", log_model="all")
    trainer = Trainer(**{**FIT, "logger": logger, "default_root_dir": tmp_path, "enable_checkpointing": True},
                      callbacks=[ModelCheckpoint(save_top_k=-1, monitor="val_loss", save_last=True)])
    trainer.fit(Logs())
    folders = sorted(a.path for a in client.list_artifacts(logger.run_id) if a.is_dir)
    assert folders == ["epoch=0-step=2", "epoch=1-step=4", "last"]


def test_resume_a_run_by_id_appends_to_it(server, client, tmp_path):
    first, logger, _ = _fit(server, tmp_path, experiment_name="resume")
    last = first.checkpoint_callback.best_model_path
    again = MLFlowLogger(tracking_uri=server, run_id=logger.run_id)
    trainer = Trainer(**{**FIT, "max_epochs": 3, "logger": again, "default_root_dir": tmp_path})
    trainer.fit(Logs(width=3), ckpt_path=last)
    assert [m.step for m in client.get_metric_history(logger.run_id, "loss")] == [0, 1, 2, 3, 4, 5]
    assert len(client.search_runs([logger.experiment_id])) == 1


def test_cli_config_is_logged_as_an_artifact(server, client, tmp_path, monkeypatch):
    pytest.importorskip("omegaconf")
    from trainer.cli import run

    (tmp_path / "run.yaml").write_text(
        "model:\n  class_path: tests.helpers.boring.BoringModel\n"
        "trainer:\n  max_epochs: 1\n  limit_train_batches: 1\n  limit_val_batches: 1\n  num_sanity_val_steps: 0\n"
        "  enable_progress_bar: false\n  enable_model_summary: false\n  accelerator: cpu\n"
        f"  default_root_dir: {tmp_path}\n"
        f"  logger:\n    class_path: trainer.loggers.MLFlowLogger\n"
        f"    init_args: {{tracking_uri: '{server}', experiment_name: cli}}\n")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    done = run(["fit", "--config", str(tmp_path / "run.yaml")])
    run_id = done.trainer.logger.run_id
    assert [a.path for a in client.list_artifacts(run_id)] == ["config.yaml"]
    text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path / "dl"))).read_text()
    assert text == (tmp_path / "config.yaml").read_text()


class SyncLogs(BoringModel):
    """Each rank logs a different value with sync_dist, per step and per epoch."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("synced", loss.detach() * (self.global_rank + 1), sync_dist=True, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("val_synced", self(batch).sum() * (self.global_rank + 1), sync_dist=True)


def _ddp_rank(rank: int, server: str, root: str) -> dict[str, Any]:
    mlf = MLFlowLogger(tracking_uri=server, experiment_name="ddp")
    trainer = Trainer(**{**FIT, "devices": 2, "strategy": "ddp", "logger": [mlf, CSVLogger(root, name="csv")],
                         "default_root_dir": root})
    trainer.fit(SyncLogs())
    return {"run_id": mlf.version, "experiment_id": mlf.name}


@pytest.mark.distributed
def test_ddp_logs_from_rank_zero_only_and_sync_dist_values_equal_the_csv_logger(server, client, tmp_path):
    ranks = run_distributed(_ddp_rank, server, str(tmp_path), timeout=200)
    assert ranks[0]["run_id"] == ranks[1]["run_id"]  # rank 1 learned rank 0's run instead of making one
    run_id = ranks[0]["run_id"]
    assert len(client.search_runs([ranks[0]["experiment_id"]])) == 1
    with open(tmp_path / "csv" / "version_0" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for key in ("synced_step", "synced_epoch", "val_synced"):
        from_csv = [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]
        from_mlflow = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        assert from_csv and sorted(from_mlflow) == sorted(from_csv), key  # a rank-1 write would add points
