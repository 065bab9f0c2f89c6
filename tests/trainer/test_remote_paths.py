"""A whole run on a remote filesystem (memory://, fsspec's in-process store): default_root_dir, the default
logger, ModelCheckpoint, resume with ckpt_path="last", load_from_checkpoint; and the folder contract of a logger
that keeps no folder of its own."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.checkpoint_io.catalog import find_checkpoints
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.owners import dead_owner_tag
from trainer import Trainer
from trainer.loggers import CSVLogger, Logger, TensorBoardLogger

FIT = {**QUIET, "max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0}


class Hparams(BoringModel):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(32, width)


def _files(root: str) -> list[str]:
    fs, inner = fsspec.core.url_to_fs(root)
    return sorted(p[len(inner.rstrip("/")) + 1:] for p in fs.find(inner))


def test_default_root_dir_url_holds_logs_and_checkpoints_and_no_local_folder(memory_root, tmp_path):
    trainer = Trainer(**{**FIT, "logger": True, "enable_checkpointing": True, "default_root_dir": memory_root})
    trainer.fit(BoringModel())
    files = _files(memory_root)
    assert any(f.startswith("runs/version_0/events.out.tfevents") for f in files)
    assert "runs/version_0/checkpoints/epoch=1-step=4.ckpt" in files  # the commit record
    assert any(f.startswith("runs/version_0/checkpoints/epoch=1-step=4.ckpt.data-") for f in files)
    assert list(tmp_path.iterdir()) == []  # the bug this fixes: a local folder named 'memory:'
    assert trainer.log_dir == f"{memory_root}/runs/version_0"


def test_checkpoint_resume_last_and_load_from_checkpoint_on_a_url(memory_root):
    ckpts = f"{memory_root}/ckpts"
    first = Trainer(**{**FIT, "enable_checkpointing": True},
                    callbacks=[ModelCheckpoint(dirpath=ckpts, save_last=True, save_top_k=-1)])
    first.fit(Hparams(width=3))
    assert first.checkpoint_callback.last_model_path == f"{ckpts}/last.ckpt"
    saved = sorted(p.rsplit("/", 1)[1] for _, p in find_checkpoints(ckpts))
    assert saved == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "last.ckpt"]

    resumed = Trainer(**{**FIT, "max_epochs": 3, "enable_checkpointing": True},
                      callbacks=[ModelCheckpoint(dirpath=ckpts, save_last=True, save_top_k=-1)])
    model = Hparams(width=3)
    resumed.fit(model, ckpt_path="last")
    assert resumed.global_step == 6  # 4 restored + one more epoch of 2

    loaded = Hparams.load_from_checkpoint(f"{ckpts}/last.ckpt")
    assert loaded.layer.out_features == 3
    assert torch.equal(loaded.layer.weight, model.layer.weight)


def test_last_ignores_a_checkpoint_whose_commit_never_landed(memory_root):
    ckpts = f"{memory_root}/ckpts"
    Trainer(**{**FIT, "enable_checkpointing": True}, callbacks=[ModelCheckpoint(dirpath=ckpts)]).fit(BoringModel())
    fs, inner = fsspec.core.url_to_fs(ckpts)
    buffer = io.BytesIO()
    torch.save({"format_version": 1}, buffer)
    orphan = f"epoch=9-step=99.ckpt.data-{dead_owner_tag()}"  # written by a process that died before its commit
    fs.pipe_file(f"{inner}/{orphan}", buffer.getvalue())  # data written, no record
    trainer = Trainer(**{**FIT, "max_epochs": 3, "enable_checkpointing": True},
                      callbacks=[ModelCheckpoint(dirpath=ckpts)])
    trainer.fit(BoringModel(), ckpt_path="last")
    assert trainer.global_step == 6
    assert not any(orphan in f for f in _files(ckpts))  # cleaned at fit start


def test_csv_logger_on_a_url(memory_root):
    trainer = Trainer(**{**FIT, "logger": CSVLogger(memory_root, name="csv"), "log_every_n_steps": 1})

    class Logs(Hparams):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    trainer.fit(Logs())
    with fsspec.open(f"{memory_root}/csv/version_0/metrics.csv", "r") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["step"] for r in rows if r.get("loss")] == ["0", "1", "2", "3"]  # Lightning's step: the steps before
    with fsspec.open(f"{memory_root}/csv/version_0/hparams.yaml", "r") as handle:
        assert handle.read() == "width: 2\n"


def test_tensorboard_logger_versions_on_a_url(memory_root):
    for _ in range(2):
        Trainer(**{**FIT, "logger": TensorBoardLogger(memory_root, name="tb")}).fit(BoringModel())
    assert sorted({f.split("/")[1] for f in _files(memory_root)}) == ["version_0", "version_1"]


class FolderlessLogger(Logger):
    """A logger that sends everything elsewhere: no save_dir, no log_dir (as MLflow with a server)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "exp"

    @property
    def version(self) -> str:
        return "run7"

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.rows.append(dict(metrics))

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        pass


def test_a_logger_without_a_folder_gives_root_dir_and_a_run_checkpoint_folder(tmp_path):
    trainer = Trainer(**{**FIT, "enable_checkpointing": True, "logger": FolderlessLogger(),
                         "default_root_dir": tmp_path})
    trainer.fit(BoringModel())
    assert trainer.log_dir == str(tmp_path)
    assert trainer.checkpoint_callback.dirpath == str(tmp_path / "exp" / "run7" / "checkpoints")
    assert (tmp_path / "exp" / "run7" / "checkpoints" / "epoch=1-step=4.ckpt").is_file()
    assert not (tmp_path / "None").exists() and not Path("None").exists()


def test_cli_saves_the_config_in_root_dir_for_a_folderless_logger(tmp_path, monkeypatch):
    pytest.importorskip("omegaconf")
    from trainer.cli import run

    (tmp_path / "run.yaml").write_text(
        "model:\n  class_path: tests.helpers.boring.BoringModel\n"
        "trainer:\n  max_epochs: 1\n  limit_train_batches: 1\n  limit_val_batches: 1\n  num_sanity_val_steps: 0\n"
        "  enable_progress_bar: false\n  enable_model_summary: false\n  accelerator: cpu\n"
        f"  default_root_dir: {tmp_path / 'root'}\n"
        "  logger:\n    class_path: tests.trainer.test_remote_paths.FolderlessLogger\n")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    run(["fit", "--config", str(tmp_path / "run.yaml")])
    assert (tmp_path / "root" / "config.yaml").is_file()
    assert not (tmp_path / "None").exists()
