"""WandbLogger in offline mode (nothing leaves the machine): the run file it writes is read back record by record,
and the model artifact it stages loads as a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.wandb_records import of_type, records, run_file, run_files
from trainer import Trainer

pytest.importorskip("wandb", reason="WandbLogger needs wandb: pip install -e '.[wandb]' (in .[dev])")
from trainer.loggers import WandbLogger  # noqa: E402

pytestmark = pytest.mark.timeout(180)
FIT = {**QUIET, "max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0,
       "log_every_n_steps": 1, "enable_checkpointing": True}


@pytest.fixture(autouse=True)
def _wandb_home(tmp_path, monkeypatch):
    """wandb's caches, staging area and settings go to the test's folder, not the home directory."""
    for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


class Logs(BoringModel):
    def __init__(self, lr: float = 0.1, sizes: tuple[int, ...] = (4, 8)) -> None:
        super().__init__()
        self.save_hyperparameters()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)
        return loss


@pytest.fixture
def fitted(tmp_path) -> tuple[Trainer, WandbLogger, Logs, Path]:
    logger = WandbLogger(project="digits", name="first", save_dir=tmp_path / "runs", offline=True, log_model=True)
    trainer = Trainer(**{**FIT, "logger": logger})
    model = Logs()
    trainer.fit(model)
    return trainer, logger, model, run_file(tmp_path / "runs")


def _history(path: Path, key: str) -> list[tuple[int, float]]:
    rows = []
    for row in of_type(path, "history"):
        items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in row.item}
        if key in items:
            rows.append((items["trainer/global_step"], items[key]))
    return rows


def test_run_name_project_and_id(fitted):
    _, logger, _, path = fitted
    (run,) = of_type(path, "run")
    assert (run.run_id, run.project, run.display_name) == (logger.version, "digits", "first")


def test_a_run_file_read_while_wandb_still_writes_it_yields_its_whole_records(fitted, tmp_path):
    """The test helper polls the run file while wandb's service appends to it: a read that ends inside a record must
    give the records before it, not fail to parse (seen once: a DecodeError in `fitted`)."""
    data = fitted[3].read_bytes()
    complete = [r.SerializeToString() for r in records(fitted[3])]
    partial = tmp_path / "partial.wandb"
    for cut in range(8, len(data), max(1, len(data) // 300)):
        partial.write_bytes(data[:cut])
        got = [r.SerializeToString() for r in records(partial)]
        assert got == complete[:len(got)], cut


def test_hyperparameters_go_to_the_config(fitted):
    path = fitted[3]
    updates = [*of_type(path, "config"), *(run.config for run in of_type(path, "run"))]  # either may carry them
    config = {u.key: json.loads(u.value_json) for c in updates for u in c.update}
    assert config["lr"] == 0.1 and config["sizes"] == [4, 8]


def test_metrics_use_the_global_step_as_x_axis(fitted):
    trainer, _, _, path = fitted
    assert [step for step, _ in _history(path, "loss")] == [0, 1, 2, 3]  # Lightning's: the steps before this one
    assert _history(path, "val_loss")[-1] == (3, pytest.approx(float(trainer.callback_metrics["val_loss"])))


def test_the_checkpoint_is_a_model_artifact_that_loads(fitted):
    trainer, logger, model, path = fitted
    (artifact,) = of_type(path, "artifact")
    assert (artifact.type, artifact.name, sorted(artifact.aliases)) == ("model", f"model-{logger.version}",
                                                                        ["best", "latest"])
    (entry,) = artifact.manifest.contents
    assert entry.path == "model.ckpt"
    loaded = Logs.load_from_checkpoint(entry.local_path)  # the copy wandb staged for `wandb sync`
    assert torch.equal(loaded.layer.weight, model.layer.weight)
    assert json.loads(artifact.metadata)["original_filename"] == "epoch=1-step=4.ckpt"


def test_checkpoints_go_to_the_run_folder(fitted, tmp_path):
    trainer, logger, _, _ = fitted
    assert trainer.log_dir == str(tmp_path)  # W&B keeps its own layout: no log_dir
    assert trainer.checkpoint_callback.dirpath == str(tmp_path / "runs" / "digits" / logger.version / "checkpoints")


def test_files_are_copied_into_the_run(tmp_path):
    logger = WandbLogger(project="files", save_dir=tmp_path, offline=True)
    (tmp_path / "config.yaml").write_text("trainer: {}\n")
    logger.log_artifact(str(tmp_path / "config.yaml"))
    logger.finalize("success")
    (copied,) = (tmp_path / "wandb").glob("offline-run-*/files/config.yaml")
    assert copied.read_text() == "trainer: {}\n"


def _redirected_run(side: str, folder: Path, parts: int) -> tuple[list[Path], str]:
    """`tests/scripts/wandb_redirected.py` under `side` with stdout and stderr to a file, as a cluster job writes
    them: (its run files, what it printed)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    folder.mkdir(parents=True)
    output = folder / "job.out"
    with output.open("w") as handle:
        done = subprocess.run([sys.executable, str(root / "tests" / "scripts" / "wandb_redirected.py"), side,
                               str(folder)], stdout=handle, stderr=subprocess.STDOUT, timeout=150,
                              env={**os.environ, "PYTHONPATH": str(root)}, check=False)
    assert done.returncode == 0, output.read_text()[-3000:]
    return run_files(folder, parts), output.read_text()


def _rows(paths: list[Path]) -> list[tuple[Any, ...]]:
    """Each history row as (its metric names, trainer/global_step, epoch): the shape of what was logged."""
    shapes = []
    for row in (row for path in paths for row in of_type(path, "history")):
        items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in row.item}
        names = tuple(sorted(k for k in items if not k.startswith("_") and k not in ("epoch", "trainer/global_step")))
        shapes.append((names, items.get("trainer/global_step"), items.get("epoch")))
    return shapes


@pytest.mark.subprocess
def test_a_redirected_run_writes_lightnings_step_and_epoch_rows(tmp_path):
    """stdout to a file: the default progress bar prints plain lines with the run id as `v_num` (a string, which
    crashed the bar), and the run file holds Lightning's rows for train steps, train and val epochs, and test.
    Ours finishes the run at the end of fit and resumes it for test (a second offline folder of the same run id:
    docs/logging.md), Lightning keeps it open: the rows are compared across the run's files."""
    pytest.importorskip("lightning.pytorch")
    ours, printed = _redirected_run("ours", tmp_path / "ours", parts=2)
    theirs, _ = _redirected_run("lightning", tmp_path / "theirs", parts=1)
    run_ids = {run.run_id for path in ours for run in of_type(path, "run")}
    assert len(run_ids) == 1
    assert "Epoch 1: 3/3 batches" in printed and f"v_num={run_ids.pop()[-4:]}" in printed
    assert "Traceback" not in printed
    rows = _rows(ours)
    assert rows == _rows(theirs)
    assert (("train_loss",), 0, 0) in rows and (("val_loss",), 2, 0) in rows
    assert (("train_mean",), 5, 1) in rows and (("test_loss",), 6, 2) in rows


def test_images_tables_text_and_watched_gradients_reach_the_run(tmp_path):
    """Lightning's WandbLogger methods: log_image (a keyword list per image), log_table, log_text, watch."""
    logger = WandbLogger(project="media", save_dir=tmp_path, offline=True)
    model = Logs()
    logger.log_image("samples", [torch.rand(3, 8, 8), torch.rand(3, 8, 8)], step=0, caption=["a", "b"])
    logger.log_table("scores", columns=["name", "value"], data=[["x", 1.0]], step=0)
    logger.log_text("notes", columns=["text"], data=[["hello"]], step=0)
    with pytest.raises(ValueError, match="caption= has 1 values for 2 items"):
        logger.log_image("bad", [torch.rand(3, 8, 8), torch.rand(3, 8, 8)], caption=["only one"])
    logger.watch(model, log="all", log_freq=1)
    Trainer(**{**FIT, "logger": logger}).fit(model)
    items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json)
             for row in of_type(run_file(tmp_path), "history") for i in row.item}
    assert items["samples/captions"] == ["a", "b"] and items["samples/count"] == 2
    assert items["scores/_type"] == items["notes/_type"] == "table-file"
    assert any(k.startswith("gradients/layer.weight") for k in items)
    assert any(k.startswith("parameters/layer.weight") for k in items)
