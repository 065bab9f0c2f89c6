"""Checkpoint bytes: damage is found on load (the zip's CRCs) and named; save and load failures are ours and say
what really went wrong (errno-matched advice, no advice to load unsafely)."""

from __future__ import annotations

import argparse
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.checkpoint_io.atomic_file import atomic_save
from strategies.checkpoint_io.safe_load import safe_load
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, seed_everything

CKPT = {**QUIET, "enable_checkpointing": True}


def _fit(folder: Path, epochs: int = 2) -> tuple[ModelCheckpoint, BoringModel]:
    seed_everything(0)
    model = BoringModel()
    cb = ModelCheckpoint(dirpath=folder, save_top_k=-1)
    Trainer(max_epochs=epochs, limit_train_batches=2, limit_val_batches=0, callbacks=[cb], **CKPT).fit(model)
    return cb, model


def _flip_weight_bytes(path: Path, weight: torch.Tensor, count: int = 32) -> str:
    """Flip `count` bytes inside the zip entry holding `weight`'s bytes; return that entry's name."""
    raw = bytearray(path.read_bytes())
    wanted = weight.detach().contiguous().numpy().tobytes()
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if archive.read(info.filename) == wanted:
                start = raw.find(wanted, info.header_offset)
                for i in range(count):
                    raw[start + 16 + i] ^= 0xFF
                path.write_bytes(bytes(raw))
                return info.filename
    raise AssertionError("the weight's entry was not found")


def test_flipped_weight_bytes_are_named_by_fit_validate_and_load_from_checkpoint(tmp_path: Path):
    cb, model = _fit(tmp_path, epochs=1)
    path = Path(cb.best_model_path)
    entry = _flip_weight_bytes(path, model.layer.weight)
    expected = rf"{path}.*damaged: entry '{entry}' fails its CRC-32.*\['state_dict'\]\['layer.weight'\]"
    with pytest.raises(CheckpointLoadError, match=expected):
        Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, **QUIET).fit(BoringModel(), ckpt_path=path)
    with pytest.raises(CheckpointLoadError, match=expected):
        Trainer(**QUIET).validate(BoringModel(), ckpt_path=path)
    with pytest.raises(CheckpointLoadError, match=expected):
        BoringModel.load_from_checkpoint(path)


def test_ckpt_path_last_falls_back_to_the_newest_intact_checkpoint(tmp_path: Path):
    cb, model = _fit(tmp_path, epochs=2)
    newest = tmp_path / "epoch=1-step=4.ckpt"
    assert cb.best_model_path == str(newest)
    _flip_weight_bytes(newest, model.layer.weight)
    trainer = Trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=0,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)], **CKPT)
    with pytest.warns(UserWarning, match=rf"skipping the damaged checkpoint {newest}.*fails its CRC-32"):
        trainer.fit(BoringModel(), ckpt_path="last")
    assert trainer.global_step == 6  # resumed from epoch=0-step=2.ckpt, then trained epochs 1 and 2


def test_a_checkpoint_written_by_plain_torch_save_still_loads_and_is_checked(tmp_path: Path):
    cb, model = _fit(tmp_path, epochs=1)
    plain = tmp_path / "plain.ckpt"
    torch.save(torch.load(cb.best_model_path, weights_only=True), plain)  # no trainer-written extras at all
    assert torch.equal(BoringModel.load_from_checkpoint(plain).layer.weight, model.layer.weight)
    _flip_weight_bytes(plain, model.layer.weight)
    with pytest.raises(CheckpointLoadError, match="fails its CRC-32"):
        safe_load(plain)


def test_a_torchscript_archive_is_named_as_such(tmp_path: Path):
    path = tmp_path / "scripted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated; users still have such files
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with pytest.raises(CheckpointLoadError, match=r"is a TorchScript archive.*torch\.jit\.load"):
        BoringModel.load_from_checkpoint(path)


def test_a_refused_global_keeps_the_cause_without_the_advice_to_load_unsafely(tmp_path: Path):
    path = tmp_path / "namespace.ckpt"
    torch.save({"format_version": 1, "hparams": argparse.Namespace(lr=1)}, path)
    with pytest.raises(CheckpointLoadError, match="argparse.Namespace") as info:
        safe_load(path)
    chain: list[BaseException] = []
    err: BaseException | None = info.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    assert type(chain[-1]).__name__ == "UnpicklingError" and "Unsupported global" in str(chain[-1])
    assert not [e for e in chain if "weights_only" in str(e) or "trust the source" in str(e)], chain


# --- save failures -------------------------------------------------------------------------------------------------
def test_a_directory_in_the_way_is_not_reported_as_a_full_disk(tmp_path: Path):
    (tmp_path / "model.ckpt").mkdir()
    with pytest.raises(CheckpointSaveError, match="EISDIR.*A directory has that name") as info:
        atomic_save({"v": 1}, tmp_path / "model.ckpt")
    assert "space" not in str(info.value)


def test_a_temp_file_removed_during_the_save_is_not_reported_as_a_full_disk(tmp_path: Path):
    def writer(obj: Any, handle: Any) -> None:
        torch.save(obj, handle)
        os.unlink(handle.name)  # someone else deleted our temp file

    with pytest.raises(CheckpointSaveError, match=r"ENOENT.*vanished during the save") as info:
        atomic_save({"v": 1}, tmp_path / "model.ckpt", write=writer)
    assert "space" not in str(info.value)
    assert os.listdir(tmp_path) == []
