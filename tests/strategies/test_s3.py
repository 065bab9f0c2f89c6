"""Checkpoints on an S3 server (moto's standalone server on 127.0.0.1, started by the tests): fit with
default_root_dir and ModelCheckpoint on s3://, resume with ckpt_path="last", load_from_checkpoint, a 2-rank DDP run
(rank 0 writes), and a sharded ZeRO-3 save through DCP's fsspec writer that resumes exactly (also
with `sharded_checkpoint="async"`)."""

from __future__ import annotations

from typing import Any

import fsspec
import pytest
import torch

from callbacks import ModelCheckpoint
from strategies import ZeroStrategy
from strategies.checkpoint_io import object_store
from strategies.checkpoint_io.catalog import find_checkpoints
from strategies.checkpoint_io.safe_load import safe_load
from strategies.exceptions import CheckpointLoadError
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from trainer import Trainer

FIT = {**QUIET, "max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0,
       "enable_checkpointing": True}


class Wide(BoringModel):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(32, width)


def _names(url: str) -> list[str]:
    fs, inner = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return sorted(p[len(inner) + 1:] for p in fs.find(inner))


def test_fit_checkpoints_resume_last_and_load_from_checkpoint(s3_bucket):
    root = f"{s3_bucket}/run"
    first = Trainer(**{**FIT, "default_root_dir": root}, callbacks=[ModelCheckpoint(save_last=True)])
    first.fit(Wide(width=3))
    folder = f"{root}/checkpoints"
    assert sorted(p.rsplit("/", 1)[1] for _, p in find_checkpoints(folder)) == ["epoch=1-step=4.ckpt", "last.ckpt"]
    assert len([n for n in _names(folder) if ".data-" in n]) == 2  # one data object per committed checkpoint

    resumed = Trainer(**{**FIT, "max_epochs": 3, "default_root_dir": root}, callbacks=[ModelCheckpoint(save_last=True)])
    model = Wide(width=3)
    resumed.fit(model, ckpt_path="last")
    assert resumed.global_step == 6
    assert _names(folder).count("epoch=1-step=4.ckpt") == 0  # top-1: the older one was removed, record and data
    assert len([n for n in _names(folder) if ".data-" in n]) == 2

    loaded = Wide.load_from_checkpoint(f"{folder}/last.ckpt")
    assert torch.equal(loaded.layer.weight, model.layer.weight)


def test_missing_bucket_is_a_clear_save_error(s3_bucket):
    trainer = Trainer(**{**FIT, "max_epochs": 1}, callbacks=[ModelCheckpoint(dirpath="s3://no-such-bucket-x1/c")])
    with pytest.raises(Exception, match=r"could not save checkpoint to s3://no-such-bucket-x1/c/.*previous"):
        trainer.fit(BoringModel())


def test_missing_checkpoint_is_a_clear_load_error(s3_bucket):
    with pytest.raises(CheckpointLoadError, match="does not exist"):
        safe_load(f"{s3_bucket}/nothing/here.ckpt")


def _ddp_rank(rank: int, root: str) -> tuple[int, list[float]]:
    trainer = Trainer(**{**FIT, "devices": 2, "strategy": "ddp", "default_root_dir": root},
                      callbacks=[ModelCheckpoint(save_last=True)])
    model = Wide()
    trainer.fit(model)
    return trainer.global_step, model.layer.weight.detach().flatten().tolist()


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_ddp_two_ranks_write_one_checkpoint_to_s3(s3_bucket):
    root = f"{s3_bucket}/ddp"
    (step0, weights0), (step1, weights1) = run_distributed(_ddp_rank, root, timeout=150)
    assert step0 == step1 == 4 and weights0 == weights1
    saved = safe_load(f"{root}/checkpoints/last.ckpt")
    assert saved["world_size"] == 2 and saved["state_dict"]["layer.weight"].flatten().tolist() == weights0


def _zero3_rank(rank: int, root: str, max_epochs: int, resume: bool, mode: Any = True) -> dict[str, Any]:
    torch.manual_seed(0)
    trainer = Trainer(**{**FIT, "devices": 2, "strategy": ZeroStrategy(stage=3, sharded_checkpoint=mode),
                         "max_epochs": max_epochs},
                      callbacks=[ModelCheckpoint(dirpath=f"{root}/ckpts", save_last=True)])
    model = Wide()
    trainer.fit(model, ckpt_path="last" if resume else None)
    weight = model.layer.weight
    weight = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
    return {"step": trainer.global_step, "weight": weight.detach().flatten().tolist()}


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", [True, "async"])
def test_zero3_sharded_checkpoint_on_s3_resumes_exactly(s3_bucket, mode):
    pytest.importorskip("torch.distributed.checkpoint")
    straight = run_distributed(_zero3_rank, f"{s3_bucket}/straight", 3, False, mode, timeout=200)
    run_distributed(_zero3_rank, f"{s3_bucket}/split", 2, False, mode, timeout=200)
    folder = f"{s3_bucket}/split/ckpts"
    fs, inner = fsspec.core.url_to_fs(f"{folder}/last.ckpt")
    record = object_store.parse_record(fs.cat_file(inner))
    assert record is not None and record["kind"] == "folder"
    shards = [n for n in _names(folder) if n.startswith(record["data"] + "/")]
    assert sorted(n.rsplit("/", 1)[1] for n in shards) == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                            "manifest.pt"]
    resumed = run_distributed(_zero3_rank, f"{s3_bucket}/split", 3, True, mode, timeout=200)
    assert resumed[0]["step"] == straight[0]["step"] == 6
    assert resumed[0]["weight"] == straight[0]["weight"]


def test_an_empty_object_is_a_clear_load_error(s3_bucket):
    fsspec.filesystem("s3").pipe_file(f"{s3_bucket}/empty.ckpt", b"")
    with pytest.raises(CheckpointLoadError, match=r"is empty \(0 bytes\)"):
        safe_load(f"{s3_bucket}/empty.ckpt")
