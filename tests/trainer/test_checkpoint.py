"""Checkpoints: contents, atomic writes, safe loading with clear errors, and resuming a fit."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies.checkpoint_io.atomic_file import atomic_save, remove_stale_temp_files
from strategies.checkpoint_io.safe_load import safe_load
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.owners import dead_owner_tag
from trainer import Trainer, seed_everything
from trainer.checkpoint.schema import FORMAT_VERSION
from trainer.exceptions import CheckpointLoadError, CheckpointSaveError


def _fitted(tmp_path: Path, epochs: int = 1) -> tuple[Trainer, BoringModel, Path]:
    seed_everything(0)
    model = BoringModel()
    trainer = Trainer(max_epochs=epochs, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    return trainer, model, path


def test_checkpoint_holds_the_documented_keys(tmp_path: Path):
    _, _, path = _fitted(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["format_version"] == FORMAT_VERSION
    assert {"state_dict", "optimizer_states", "lr_schedulers", "precision", "progress", "epoch", "global_step",
            "hparams", "callbacks", "rng", "world_size"} <= set(checkpoint)
    assert checkpoint["global_step"] == 8 and checkpoint["progress"]["current_epoch"] == 1


def test_resume_continues_from_the_saved_epoch(tmp_path: Path):
    trainer, model, path = _fitted(tmp_path, epochs=2)
    resumed_model = BoringModel()
    resumed = Trainer(max_epochs=3, limit_val_batches=0, **QUIET)
    resumed.fit(resumed_model, ckpt_path=path)
    assert resumed.global_step == 24 and resumed.current_epoch == 3

    seed_everything(0)
    reference = BoringModel()
    Trainer(max_epochs=3, limit_val_batches=0, **QUIET).fit(reference)
    for a, b in zip(reference.state_dict().values(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_ckpt_path_last_without_checkpoints_starts_fresh(tmp_path: Path, capsys: pytest.CaptureFixture):
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, default_root_dir=tmp_path,
                      **{**QUIET, "enable_checkpointing": True})
    trainer.fit(BoringModel(), ckpt_path="last")
    assert "found no checkpoint; starting from scratch" in capsys.readouterr().out
    assert trainer.global_step == 2
    again = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, default_root_dir=tmp_path,
                    **{**QUIET, "enable_checkpointing": True})
    again.fit(BoringModel(), ckpt_path="last")
    assert again.global_step == 4


def test_ckpt_path_last_finds_the_checkpoint_of_an_earlier_logger_version(tmp_path: Path):
    pytest.importorskip("tensorboard")
    flags = {**QUIET, "logger": True, "enable_checkpointing": True, "default_root_dir": tmp_path}
    Trainer(max_epochs=1, limit_val_batches=0, **flags).fit(BoringModel())
    requeued = Trainer(max_epochs=2, limit_val_batches=0, **flags)
    requeued.fit(BoringModel(), ckpt_path="last")  # a new run gets version_1, but resumes from version_0
    assert requeued.global_step == 16 and Path(requeued.log_dir).name == "version_1"
    best = Trainer(max_epochs=3, limit_val_batches=0, **flags)
    best.fit(BoringModel(), ckpt_path="last")
    assert best.global_step == 24


def test_atomic_save_keeps_the_old_file_when_the_writer_fails(tmp_path: Path):
    path = tmp_path / "c.ckpt"
    atomic_save({"v": 1}, path)

    def broken_writer(obj: Any, handle: Any) -> None:
        handle.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointSaveError, match=r"ENOSPC: No space.*previous checkpoint.*disk is full"):
        atomic_save({"v": 2}, path, write=broken_writer)
    assert safe_load(path) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.ckpt"]


def test_stale_temp_files_are_removed(tmp_path: Path):
    dead = f"c.ckpt.tmp-{dead_owner_tag()}"
    (tmp_path / dead).write_bytes(b"junk")
    (tmp_path / "keep.ckpt").write_bytes(b"x")
    removed = remove_stale_temp_files(tmp_path)
    assert [p.name for p in removed] == [dead]
    assert os.listdir(tmp_path) == ["keep.ckpt"]


@pytest.mark.parametrize("damage", ["empty", "one_byte", "half", "all_but_last", "random", "gzip", "text"])
def test_damaged_files_give_a_checkpoint_load_error(tmp_path: Path, damage: str):
    _, _, path = _fitted(tmp_path)
    raw = path.read_bytes()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes({
        "empty": b"", "one_byte": raw[:1], "half": raw[: len(raw) // 2], "all_but_last": raw[:-1],
        "random": os.urandom(4096), "gzip": gzip.compress(raw), "text": b"hello, world\n",
    }[damage])
    with pytest.raises(CheckpointLoadError, match=str(bad)) as info:
        Trainer(max_epochs=1, **QUIET).fit(BoringModel(), ckpt_path=bad)
    message = str(info.value)
    assert "is empty" in message or "not a valid checkpoint (truncated or corrupted)" in message
    assert "will likely succeed" not in message


def test_objects_a_hook_adds_to_the_checkpoint_fail_at_save_time_naming_the_key(tmp_path: Path):
    from collections import defaultdict

    class Holder(BoringModel):
        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["config"] = defaultdict(int, {"lr": 1})  # torch's safe loader refuses defaultdict

    model = Holder()
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    expected = r"checkpoint\['config'\] holds a collections.defaultdict"
    with pytest.raises(CheckpointSaveError, match=expected):
        trainer.save_checkpoint(tmp_path / "bad.ckpt")
    assert not (tmp_path / "bad.ckpt").exists()


def test_missing_path_and_directory_give_clear_errors(tmp_path: Path):
    with pytest.raises(CheckpointLoadError, match=r"does not exist"):
        safe_load(tmp_path / "nope.ckpt")
    with pytest.raises(CheckpointLoadError, match=r"is a directory"):
        safe_load(tmp_path)


def test_malicious_pickle_is_refused_and_never_executed(tmp_path: Path):
    sentinel = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {sentinel}",))

    path = tmp_path / "evil.ckpt"
    torch.save({"format_version": 1, "payload": Evil()}, path)
    refused = r"refused by the safe \(weights-only\) loader: it references posix.system"
    with pytest.raises(CheckpointLoadError, match=refused):
        safe_load(path)
    assert not sentinel.exists()


def test_foreign_and_newer_checkpoints_are_named(tmp_path: Path):
    foreign = tmp_path / "other_tool.ckpt"
    torch.save({"state_dict": {}, "model_version": 3}, foreign)
    with pytest.raises(CheckpointLoadError, match=r"no 'format_version': it was not written by this trainer\.$"):
        Trainer(max_epochs=1, **QUIET).fit(BoringModel(), ckpt_path=foreign)
    lightning = tmp_path / "lightning.ckpt"  # read (tests/compat/test_lightning_checkpoints.py), here of another model
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.6"}, lightning)
    with pytest.raises(CheckpointLoadError, match=r"lightning.ckpt does not match the model: missing keys"):
        Trainer(max_epochs=1, **QUIET).fit(BoringModel(), ckpt_path=lightning)
    newer = tmp_path / "newer.ckpt"
    torch.save({"format_version": FORMAT_VERSION + 1}, newer)
    with pytest.raises(CheckpointLoadError, match=r"newer than this release understands"):
        Trainer(max_epochs=1, **QUIET).fit(BoringModel(), ckpt_path=newer)


def test_checkpoint_of_a_different_model_lists_the_mismatch(tmp_path: Path):
    _, _, path = _fitted(tmp_path)

    class Wider(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 3)

    expected = (r"does not match the model: shape mismatches \(2\): layer.weight \(checkpoint \(2, 32\), model "
                r"\(3, 32\)\), layer.bias .*strict=False")
    with pytest.raises(CheckpointLoadError, match=expected):
        Trainer(max_epochs=1, **QUIET).fit(Wider(), ckpt_path=path)


def test_load_from_checkpoint_lists_missing_and_unexpected_keys(tmp_path: Path):
    _, _, path = _fitted(tmp_path)

    class Renamed(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.extra = torch.nn.Linear(2, 2)

    with pytest.raises(CheckpointLoadError, match=r"missing keys \(2\): extra.weight, extra.bias.*strict=False"):
        Renamed.load_from_checkpoint(path)
    model = Renamed.load_from_checkpoint(path, strict=False)
    assert torch.equal(model.layer.weight, torch.load(path, weights_only=True)["state_dict"]["layer.weight"])


_SAVE_DTENSOR = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.tensor import Replicate, distribute_tensor, init_device_mesh
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
torch.save({"w": distribute_tensor(torch.arange(4.0), mesh, [Replicate()])}, sys.argv[1])
dist.destroy_process_group()
"""
_LOAD = """
import sys
import trainer  # noqa: F401  (does not import torch.distributed.tensor: import time is a benchmark)
from strategies.checkpoint_io.safe_load import safe_load
assert "torch.distributed.tensor" not in sys.modules
print(safe_load(sys.argv[1])["w"].to_local().tolist())
"""


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_safe_load_reads_dtensors_in_a_process_that_never_imported_them(tmp_path: Path):
    """A zero2/zero3 run can leave DTensors in a file; the weights-only loader needs their module imported."""
    import subprocess
    import sys

    from strategies.comm.distributed import find_free_port

    path, env = tmp_path / "dtensor.pt", {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-c", _SAVE_DTENSOR, str(path), str(find_free_port())], check=True, env=env,
                   timeout=100)
    out = subprocess.run([sys.executable, "-c", _LOAD, str(path)], check=True, env=env, timeout=100,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "[0.0, 1.0, 2.0, 3.0]", out.stderr
