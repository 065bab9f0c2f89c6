"""ModelCheckpoint's public surface as Lightning 2.6 has it: scores as 0-d tensors, the k-th best, the class constants
that name files, `dirpath` as an absolute string, real annotations for jsonargparse, the cadence checks, NaN scores,
the `state_key`, when `last.ckpt` is written, and which files resuming keeps. Where a run is compared, Lightning's
own callback runs the same configuration beside ours (the oracle)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.curves import FLAGS, fit_lightning, fit_ours
from trainer import Trainer

RUN = {**QUIET, "enable_checkpointing": True, **FLAGS}


def _ours(folder: Path, values: list[float], flags: dict[str, Any] | None = None, cls: type = ModelCheckpoint,
          **options: Any) -> ModelCheckpoint:
    callback = cls(dirpath=folder, **options)
    fit_ours([callback], values, **(flags or {}))
    return callback


def _lightnings(folder: Path, values: list[float], flags: dict[str, Any] | None = None, **options: Any) -> Any:
    pl = pytest.importorskip("lightning.pytorch")
    callback = pl.callbacks.ModelCheckpoint(dirpath=folder, **options)
    fit_lightning([callback], values, **(flags or {}))
    return callback


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _view(callback: Any) -> dict[str, Any]:
    """What a user reads back, with paths as file names (the two runs write to different folders)."""
    def name(path: str) -> str:
        return os.path.basename(path)

    def number(score: Any) -> float | None:
        return None if score is None else score.item()

    return {"best": (name(callback.best_model_path), number(callback.best_model_score)),
            "kth": (name(callback.kth_best_model_path), number(callback.kth_value)),
            "top_k": {name(p): number(s) for p, s in callback.best_k_models.items()},
            "current": number(callback.current_score), "last": name(callback.last_model_path)}


def test_scores_are_0d_tensors_with_lightnings_values(tmp_path: Path):
    """Scripts call `.item()` on `best_model_score` and on the values of `best_k_models`: they are tensors."""
    options = {"monitor": "val_score", "mode": "max", "save_top_k": 2, "filename": "{epoch}"}
    ours = _ours(tmp_path / "ours", [3.0, 1.0, 2.0, 0.0], **options)
    assert isinstance(ours.best_model_score, torch.Tensor) and ours.best_model_score.dim() == 0
    assert all(isinstance(s, torch.Tensor) and s.dim() == 0 for s in ours.best_k_models.values())
    assert _view(ours) == _view(_lightnings(tmp_path / "theirs", [3.0, 1.0, 2.0, 0.0], **options))
    assert _view(ours)["kth"] == ("epoch=2.ckpt", 2.0)


def test_the_class_constants_name_the_files(tmp_path: Path):
    class Renamed(ModelCheckpoint):
        CHECKPOINT_NAME_LAST = "{epoch}-last"
        FILE_EXTENSION = ".pt"
        CHECKPOINT_JOIN_CHAR = "_"

    callback = _ours(tmp_path, [1.0, 2.0], cls=Renamed, save_last=True)
    assert _files(tmp_path) == ["epoch=1-last.pt", "epoch=1_step=4.pt"]
    assert callback.last_model_path == str(tmp_path / "epoch=1-last.pt")


def test_format_checkpoint_name_takes_lightnings_arguments(tmp_path: Path):
    callback = ModelCheckpoint(dirpath=tmp_path, filename="{epoch:03d}-{val/loss:.2f}")
    metrics = {"epoch": torch.tensor(5), "val/loss": torch.tensor(0.1234)}
    assert callback.format_checkpoint_name(metrics) == str(tmp_path / "epoch=005-val_loss=0.12.ckpt")
    assert callback.format_checkpoint_name(metrics, ver=2, prefix="run") == \
        str(tmp_path / "run-epoch=005-val_loss=0.12-v2.ckpt")
    assert callback.format_checkpoint_name({}, filename="{missing}") == str(tmp_path / "missing=0.ckpt")


def test_dirpath_is_an_absolute_string_with_home_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert ModelCheckpoint(dirpath="~/ckpts").dirpath == str(tmp_path / "home" / "ckpts")
    assert ModelCheckpoint(dirpath=Path("runs") / "a").dirpath == str(tmp_path / "runs" / "a")
    assert ModelCheckpoint(dirpath="./~/ckpts").dirpath == str(tmp_path / "~" / "ckpts")  # a folder called ~
    callback = ModelCheckpoint()
    Trainer(default_root_dir=tmp_path, callbacks=[callback], max_epochs=1, **RUN).fit(BoringModel())
    assert callback.dirpath == str(tmp_path / "checkpoints")


@pytest.mark.parametrize(("given", "parsed"), [("true", True), ("no", False), ("link", "link")])
def test_jsonargparse_reads_save_last_from_the_signature(given: str, parsed: Any):
    """LightningCLI builds its parser from the constructor's annotations: they must be types, not strings."""
    import inspect

    jsonargparse = pytest.importorskip("jsonargparse")
    annotation = inspect.signature(ModelCheckpoint).parameters["save_last"].annotation
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--save_last", type=annotation)
    assert parser.parse_args(["--save_last", given]).save_last == parsed


def test_a_negative_cadence_is_refused_and_a_zero_one_is_off():
    for flag in ("every_n_epochs", "every_n_train_steps"):
        with pytest.raises(ConfigError, match=f"{flag}=-3. Must be >= 0"):
            ModelCheckpoint(**{flag: -3})
    with pytest.raises(ConfigError, match="mutually exclusive"):
        ModelCheckpoint(every_n_train_steps=2, every_n_epochs=3)
    callback = ModelCheckpoint(every_n_train_steps=4, every_n_epochs=0)  # 0 is off: one cadence only
    assert (callback.every_n_train_steps, callback.every_n_epochs) == (4, 0)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_nan_score_is_saved_as_the_worst_and_replaced(tmp_path: Path, mode: str):
    scores = [math.nan, 5.0, 7.0, 8.0] if mode == "max" else [math.nan, 8.0, 7.0, 5.0]
    options = {"monitor": "val_score", "mode": mode, "save_top_k": 1, "filename": "{epoch}"}
    ours = _ours(tmp_path / "ours", scores[:1], **options)
    assert ours.current_score.item() == (math.inf if mode == "min" else -math.inf)
    assert _files(tmp_path / "ours") == ["epoch=0.ckpt"]
    ours = _ours(tmp_path / "all", scores, **options)
    assert _view(ours) == _view(_lightnings(tmp_path / "theirs", scores, **options))
    assert ours.best_model_score.item() == scores[-1]


def test_state_keys_are_lightnings(tmp_path: Path):
    """A checkpoint's `callbacks` keys are the same under both, so each side's states load into the other."""
    pl = pytest.importorskip("lightning.pytorch")
    from datetime import timedelta

    for options in ({}, {"monitor": "val_loss", "mode": "max"}, {"every_n_train_steps": 5},
                    {"train_time_interval": timedelta(minutes=2)}):
        assert ModelCheckpoint(**options).state_key == pl.callbacks.ModelCheckpoint(**options).state_key
    trainer = Trainer(callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="one")], max_epochs=1, **RUN)
    trainer.fit(BoringModel())
    saved = torch.load(tmp_path / "one.ckpt", weights_only=True)["callbacks"]
    assert pl.callbacks.ModelCheckpoint(dirpath=tmp_path).state_key in saved


def test_last_is_written_when_a_checkpoint_is_saved(tmp_path: Path):
    """Lightning 2.6: `last.ckpt` follows the saved checkpoints (an epoch that enters no top-k leaves it)."""
    scores = [1.0, 2.0, 0.5, 3.0]
    options = {"monitor": "val_score", "save_last": True, "filename": "{epoch}"}
    ours = _ours(tmp_path / "ours", scores, **options)
    theirs = _lightnings(tmp_path / "theirs", scores, **options)
    assert _files(tmp_path / "ours") == _files(tmp_path / "theirs") == ["epoch=2.ckpt", "last.ckpt"]
    assert torch.load(ours.last_model_path, weights_only=True)["epoch"] == \
        torch.load(theirs.last_model_path, weights_only=False)["epoch"] == 2


def test_save_last_without_any_save_writes_last_at_the_end(tmp_path: Path):
    callback = _ours(tmp_path, [1.0, 1.0], every_n_epochs=0, save_top_k=0, save_last=True)
    assert _files(tmp_path) == ["last.ckpt"] and callback.last_model_path == str(tmp_path / "last.ckpt")


def test_a_several_epochs_validation_cadence_saves_after_validation(tmp_path: Path):
    options = {"monitor": "val_score", "mode": "max", "save_top_k": -1, "filename": "{epoch}"}
    scores = [0.0, 1.0, 2.0, 3.0, 4.0]
    _ours(tmp_path / "ours", scores, {"check_val_every_n_epoch": 2}, **options)
    _lightnings(tmp_path / "theirs", scores, {"check_val_every_n_epoch": 2}, **options)
    assert _files(tmp_path / "ours") == _files(tmp_path / "theirs") == ["epoch=1.ckpt", "epoch=3.ckpt"]


def test_resuming_in_the_same_folder_keeps_the_checkpoint_resumed_from(tmp_path: Path):
    options = {"monitor": "step", "mode": "max", "save_top_k": 2, "every_n_train_steps": 2}
    flags = {**RUN, "limit_train_batches": 10, "limit_val_batches": 0}
    Trainer(callbacks=[ModelCheckpoint(dirpath=tmp_path, **options)], max_steps=4, **flags).fit(BoringModel())
    assert _files(tmp_path) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    trainer = Trainer(callbacks=[ModelCheckpoint(dirpath=tmp_path, **options)], max_steps=8, **flags)
    trainer.fit(BoringModel(), ckpt_path=tmp_path / "epoch=0-step=4.ckpt")
    assert trainer.ckpt_path == str(tmp_path / "epoch=0-step=4.ckpt")
    assert _files(tmp_path) == ["epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt"]


def test_to_yaml_writes_the_top_k(tmp_path: Path):
    import yaml

    callback = _ours(tmp_path, [3.0, 1.0, 2.0], monitor="val_score", mode="max", save_top_k=2, filename="{epoch}")
    callback.to_yaml()
    written = yaml.safe_load((tmp_path / "best_k_models.yaml").read_text())
    assert written == {str(tmp_path / "epoch=0.ckpt"): 3.0, str(tmp_path / "epoch=2.ckpt"): 2.0}


def test_a_state_from_another_folder_restores_only_the_best_path(tmp_path: Path):
    written = ModelCheckpoint(dirpath=tmp_path / "a", monitor="x")
    written.best_model_path, written.best_model_score = str(tmp_path / "a" / "b.ckpt"), torch.tensor(1.5)
    restored = ModelCheckpoint(dirpath=tmp_path / "other", monitor="x")
    with pytest.warns(UserWarning, match="The dirpath has changed"):
        restored.load_state_dict(written.state_dict())
    assert restored.best_model_path == written.best_model_path and restored.best_model_score is None
