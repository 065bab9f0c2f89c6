"""Crafted checkpoint contents (issue 18, BI-13): a file the safe loader reads but whose entries are wrong is a
CheckpointLoadError naming the file, the entry and the fix, through every way a checkpoint is loaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.exceptions import CheckpointLoadError


class HparamsModel(BoringModel):
    def __init__(self, batch_size: int = 8, length: int = 64) -> None:
        super().__init__(batch_size, length)
        self.save_hyperparameters()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real checkpoint of a 1-step fit, as a dict to craft variants from."""
    path = tmp_path_factory.mktemp("real") / "real.ckpt"
    trainer = Trainer(max_steps=1, limit_val_batches=0, **QUIET)
    trainer.fit(HparamsModel())
    trainer.save_checkpoint(path)
    return torch.load(path, weights_only=True)


def _fit(path: Path) -> None:
    Trainer(max_steps=2, limit_val_batches=0, **QUIET).fit(HparamsModel(), ckpt_path=path)


def _validate(path: Path) -> None:
    Trainer(**QUIET).validate(HparamsModel(), ckpt_path=path)


def _load(path: Path) -> None:
    HparamsModel.load_from_checkpoint(path)


LOADERS: dict[str, Callable[[Path], None]] = {"fit": _fit, "validate": _validate, "load_from_checkpoint": _load}


def _crafted(tmp_path: Path, saved: dict[str, Any], **changes: Any) -> Path:
    checkpoint = {**saved, **changes}
    for key in [k for k, v in changes.items() if v is _DROP]:
        del checkpoint[key]
    path = tmp_path / "crafted.ckpt"
    torch.save(checkpoint, path)
    return path


_DROP = object()


@pytest.mark.parametrize("how", list(LOADERS))
def test_a_checkpoint_without_weights_names_the_path_and_the_fix(tmp_path: Path, how: str):
    path = tmp_path / "crafted.ckpt"
    torch.save({"format_version": 1}, path)
    with pytest.raises(CheckpointLoadError) as info:
        LOADERS[how](path)
    message = str(info.value)
    assert str(path) in message and "has no 'state_dict' (the model weights)" in message, message
    assert "Load checkpoints written by trainer.save_checkpoint() or ModelCheckpoint" in message, message


@pytest.mark.parametrize("how", list(LOADERS))
def test_list_hparams_are_refused_with_the_entry_named(tmp_path: Path, saved: dict[str, Any], how: str):
    path = _crafted(tmp_path, saved, hparams=[8, 64])
    with pytest.raises(CheckpointLoadError, match=r"entry 'hparams' holds a list, but it must be a dict") as info:
        LOADERS[how](path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"state_dict": {"layer.weight": [1.0, 2.0]}}, r"'state_dict' entry 'layer.weight' holds a list"),
        ({"state_dict": [torch.zeros(2)]}, r"entry 'state_dict' holds a list"),
        ({"hparams": {"batch size": 8}}, r"'hparams' has the key 'batch size'.*load_from_checkpoint\(path, \*\*"),
        ({"optimizer_states": {"0": {}}}, r"entry 'optimizer_states' holds a dict, but it must be a list"),
        ({"progress": {"global_step": "1"}}, r"'progress' entry 'global_step' holds a str"),
        ({"rng": "seed"}, r"entry 'rng' holds a str"),
    ],
)
def test_entries_of_the_wrong_type_are_named(tmp_path: Path, saved: dict[str, Any], changes: dict, match: str):
    with pytest.raises(CheckpointLoadError, match=match):
        _fit(_crafted(tmp_path, saved, **changes))


def test_weights_only_checkpoint_cannot_resume_and_says_what_to_do(tmp_path: Path):
    path = tmp_path / "weights.ckpt"
    trainer = Trainer(max_steps=1, limit_val_batches=0, **QUIET)
    trainer.fit(HparamsModel())
    trainer.save_checkpoint(path, weights_only=True)
    with pytest.raises(CheckpointLoadError, match=r"has no 'optimizer_states': it holds the weights only") as info:
        _fit(path)
    assert "load_from_checkpoint(path) and call fit(model) without ckpt_path" in str(info.value)
    assert torch.equal(HparamsModel.load_from_checkpoint(path).layer.weight, trainer.lightning_module.layer.weight)
