"""Checkpoints made by an attacker (or a careless tool): every file here is built by the test itself, loaded the way
a user would load it, and must load nothing, run nothing and delete nothing, with an error naming the file and what
was wrong (issue 39, defects 1 and 2)."""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.checkpoint_io.object_store import RECORD_KEY
from strategies.checkpoint_io.safe_load import safe_load
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, seed_everything


def _fitted_checkpoint(folder: Path) -> tuple[Path, BoringModel]:
    seed_everything(0)
    model = BoringModel()
    cb = ModelCheckpoint(dirpath=folder, save_top_k=-1)
    Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, callbacks=[cb],
            **{**QUIET, "enable_checkpointing": True}).fit(model)
    return Path(cb.best_model_path), model


def _rezip(raw: bytes, change: Callable[[str, bytes], bytes]) -> bytes:
    """The archive rebuilt entry by entry with `change` applied: every CRC in it matches its (changed) bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as archive, zipfile.ZipFile(out, "w") as rebuilt:
        for info in archive.infolist():
            rebuilt.writestr(info.filename, change(info.filename, archive.read(info.filename)))
    return out.getvalue()


def _entry_of(raw: bytes, tensor: torch.Tensor) -> str:
    wanted = tensor.detach().contiguous().numpy().tobytes()
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        return next(n for n in archive.namelist() if archive.read(n) == wanted)


@pytest.mark.parametrize("cut", ["shorter", "longer"])
def test_a_weight_record_of_the_wrong_size_is_refused_on_every_load_path(tmp_path: Path, cut: str):
    """Defect 1: the memory-mapped load skipped torch's record-size check, so a re-zipped file whose weight record
    was cut in half loaded nan/1e37 weights and fit trained on them."""
    path, model = _fitted_checkpoint(tmp_path / "run")
    raw = path.read_bytes()
    entry = _entry_of(raw, model.layer.weight)
    bad = tmp_path / f"{cut}.ckpt"
    bad.write_bytes(_rezip(raw, lambda name, data: (data[: len(data) // 2] if cut == "shorter" else data + data)
                           if name == entry else data))
    held = 128 if cut == "shorter" else 512
    expected = rf"{bad}.*'state_dict'\]\['layer.weight'\].*declares 256 bytes.*{entry}' holds {held} bytes"
    started = time.perf_counter()
    with pytest.raises(CheckpointLoadError, match=expected):
        BoringModel.load_from_checkpoint(bad)
    elapsed = time.perf_counter() - started
    with pytest.raises(CheckpointLoadError, match=expected):
        Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, **QUIET).fit(BoringModel(), ckpt_path=bad)
    with pytest.raises(CheckpointLoadError, match=expected):
        safe_load(bad)
    # the same bytes on a store are read whole, not mapped: the same check names the same tensor
    with fsspec.open(f"memory://untrusted/{cut}.ckpt", "wb") as handle:
        handle.write(bad.read_bytes())
    with pytest.raises(CheckpointLoadError, match=rf"memory://untrusted/{cut}.ckpt.*\['layer.weight'\]"):
        BoringModel.load_from_checkpoint(f"memory://untrusted/{cut}.ckpt")
    assert elapsed < 5, f"the refusal took {elapsed:.2f} s"
    # the untouched file still loads, equal to the model that wrote it
    assert torch.equal(BoringModel.load_from_checkpoint(path).layer.weight, model.layer.weight)


def test_a_compressed_archive_is_refused_before_a_mapped_load_reads_its_compressed_bytes(tmp_path: Path):
    path, _ = _fitted_checkpoint(tmp_path / "run")
    deflated = tmp_path / "deflated.ckpt"
    with zipfile.ZipFile(path) as archive, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as rebuilt:
        for info in archive.infolist():
            rebuilt.writestr(info.filename, archive.read(info.filename))
    with pytest.raises(CheckpointLoadError, match=rf"{deflated}.*entry '.*' is compressed"):
        BoringModel.load_from_checkpoint(deflated)


# --- defect 2: a planted commit record steers no deletion and no read -------------------------------------------
def _plant_record(url: str, data: str, kind: str) -> None:
    with fsspec.open(url, "wb") as handle:
        handle.write(json.dumps({RECORD_KEY: 1, "data": data, "kind": kind, "size": 1, "written_ns": 1}).encode())


def _fitted_trainer() -> Trainer:
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(BoringModel())
    return trainer


def _objects(url: str) -> list[str]:
    fs, inner = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return sorted(fs.find(inner))


@pytest.mark.parametrize("data", ["/{victim}", "../{victim}", "model.ckpt.data-x/../../{victim}", "{victim}",
                                  "other.ckpt.data-1"])
def test_a_planted_record_on_a_memory_store_deletes_and_reads_nothing(memory_root: str, data: str):
    fs = fsspec.filesystem("memory")
    victim = f"{memory_root}/victim"
    fs.pipe({f"{victim}/keep.txt": b"precious", f"{memory_root}/ckpts/other.ckpt.data-1": b"another run's data"})
    before = _objects(memory_root)
    url = f"{memory_root}/ckpts/model.ckpt"
    target = data.format(victim=fsspec.core.url_to_fs(victim)[1].lstrip("/"))
    _plant_record(url, target, "folder")
    trainer = _fitted_trainer()
    started = time.perf_counter()
    refused = rf"commit record memory:///?{url[len('memory://'):]} was refused"
    with pytest.raises(CheckpointSaveError, match=rf"{refused}: it names the data.*nothing was read or deleted"):
        trainer.save_checkpoint(url)
    elapsed = time.perf_counter() - started
    with pytest.raises(CheckpointLoadError, match=refused):
        BoringModel.load_from_checkpoint(url)
    from strategies.checkpoint_io.catalog import find_checkpoints, remove_checkpoint

    with pytest.raises(CheckpointSaveError, match="was refused"):
        remove_checkpoint(url)
    with pytest.warns(UserWarning, match=rf"skipping the commit record memory:///?{url[len('memory://'):]}"):
        assert find_checkpoints(f"{memory_root}/ckpts") == []
    assert _objects(memory_root) == sorted([*before, fsspec.core.url_to_fs(url)[1]]), "something was deleted"
    assert fs.cat(f"{victim}/keep.txt") == b"precious"
    assert elapsed < 5


def test_a_planted_record_on_s3_deletes_nothing_in_another_bucket(s3_bucket: str):
    """The attack of the issue on a real S3 endpoint: a record naming an object, then a folder record naming the
    whole bucket, of another bucket; then a plain save_checkpoint."""
    import uuid

    fs = fsspec.filesystem("s3")
    other = f"victim-{uuid.uuid4().hex[:12]}"
    fs.mkdir(other)
    fs.pipe({f"{other}/secret.bin": b"s" * 100, f"{other}/deep/more.bin": b"m" * 10})
    url = f"{s3_bucket}/ckpts/model.ckpt"
    trainer = _fitted_trainer()
    for data, kind in ((f"{other}/secret.bin", "file"), (other, "folder"), (f"/{other}", "folder")):
        _plant_record(url, data, kind)
        with pytest.raises(CheckpointSaveError, match=rf"commit record {url} was refused"):
            trainer.save_checkpoint(url)
        with pytest.raises(CheckpointLoadError, match=rf"commit record {url} was refused"):
            safe_load(url)
        fs.invalidate_cache()
        assert sorted(fs.find(other)) == [f"{other}/deep/more.bin", f"{other}/secret.bin"], (data, kind)
    # a record of ours is followed and replaced as before: the data it named goes, nothing else
    fs.rm(fsspec.core.url_to_fs(url)[1])
    trainer.save_checkpoint(url)
    trainer.save_checkpoint(url)
    assert len([p for p in _objects(f"{s3_bucket}/ckpts") if ".data-" in p]) == 1
    assert sorted(fs.find(other)) == [f"{other}/deep/more.bin", f"{other}/secret.bin"]
    assert torch.equal(BoringModel.load_from_checkpoint(url).layer.weight, trainer.lightning_module.layer.weight)
