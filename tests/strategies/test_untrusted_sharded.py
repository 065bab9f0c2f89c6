"""Sharded (ZeRO) checkpoint folders made by an attacker: DCP unpickles `.metadata` and reads non-tensor values with
`torch.load(weights_only=False)`, so a folder is code unless it is verified and read safely (issue 39, defect 3).
Every folder here is built by the test from a real 2-rank ZeRO-3 save; none may run code, through
`python -m trainer consolidate` or a 2-rank `fit(ckpt_path=...)`, and the error names the folder and what was wrong."""

from __future__ import annotations

import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import ZeroStrategy
from strategies.checkpoint_io.sharded.manifest import READABLE_FORMAT_VERSIONS, sha256_of
from strategies.checkpoint_io.sharded.safe_read import read_metadata
from strategies.exceptions import CheckpointLoadError
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from trainer import Trainer, seed_everything
from trainer.checkpoint.schema import FORMAT_VERSION

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[2]


class _Payload:
    """Pickles as a call that writes the sentinel file: what a malicious `.metadata` or stored value holds."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"echo pwned > {shlex.quote(str(self.sentinel))}",)


def _fit_rank(rank: int, folder: str, ckpt: str | None) -> str:
    seed_everything(0)
    trainer = Trainer(max_steps=2, limit_val_batches=0, **{**QUIET, "devices": 2,
                                                           "strategy": ZeroStrategy(stage=3, sharded_checkpoint=True)})
    try:
        trainer.fit(BoringModel(), ckpt_path=ckpt)
    except CheckpointLoadError as err:
        return f"CheckpointLoadError: {err}"
    if ckpt is None:
        trainer.save_checkpoint(Path(folder) / "good.ckpt")
    return "ok"


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    assert run_distributed(_fit_rank, str(root), None, timeout=150) == ["ok", "ok"]
    good = root / "good.ckpt"
    assert sorted(p.name for p in good.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.pt"]
    return good


def _manifest(folder: Path) -> dict[str, Any]:
    return torch.load(folder / "manifest.pt", weights_only=True)


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    torch.save(manifest, folder / "manifest.pt")


def _relist(folder: Path) -> None:
    """The attacker's consistent folder: the manifest lists every file with its true sha256."""
    manifest = _manifest(folder)
    manifest["sharded_files"] = {p.name: sha256_of(p) for p in sorted(folder.iterdir()) if p.name != "manifest.pt"}
    _write_manifest(folder, manifest)


def _evil_metadata(folder: Path, sentinel: Path) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(sentinel)))


def _lists_no_files(folder: Path, sentinel: Path) -> str:
    _evil_metadata(folder, sentinel)
    _write_manifest(folder, {**_manifest(folder), "sharded_files": {}})
    return "lists no shard files"


def _omits_metadata(folder: Path, sentinel: Path) -> str:
    _evil_metadata(folder, sentinel)
    manifest = _manifest(folder)
    manifest["sharded_files"].pop(".metadata")
    _write_manifest(folder, manifest)
    return "does not list DCP's .metadata"


def _lacks_sharded_files(folder: Path, sentinel: Path) -> str:
    _evil_metadata(folder, sentinel)
    manifest = _manifest(folder)
    del manifest["sharded_files"]
    _write_manifest(folder, manifest)
    return "lists no shard files"


def _only_a_version(folder: Path, sentinel: Path) -> str:
    _evil_metadata(folder, sentinel)
    _write_manifest(folder, {"format_version": 1})
    return "optimizer_count None"


def _listed_with_its_true_hash(folder: Path, sentinel: Path) -> str:
    _evil_metadata(folder, sentinel)
    _relist(folder)
    return r"\.metadata was refused without running it: UnpicklingError: it names the global posix.system"


def _flipped_shard_dropped_from_the_manifest(folder: Path, sentinel: Path) -> str:
    shard = folder / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    manifest = _manifest(folder)
    manifest["sharded_files"].pop("__1_0.distcp")
    _write_manifest(folder, manifest)
    return "holds '__1_0.distcp', which its manifest does not list"


def _evil_stored_value(folder: Path, sentinel: Path) -> str:
    """A non-tensor value of the shards (DCP reads those with weights_only=False) replaced by the payload, and
    `.metadata` (a real one) pointed at it, every hash made true again."""
    metadata = read_metadata((folder / ".metadata").read_bytes(), "test")
    shard = folder / "__0_0.distcp"
    blob = pickle.dumps(_Payload(sentinel))  # torch.load(weights_only=False) unpickles a bare pickle too
    start = shard.stat().st_size
    with open(shard, "ab") as handle:
        handle.write(blob)
    index = next(i for i in metadata.storage_data if i.fqn.startswith("optim.0.param_groups"))
    info = metadata.storage_data[index]
    info.relative_path, info.offset, info.length = "__0_0.distcp", start, len(blob)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    _relist(folder)
    return f"the stored value '{index.fqn}' was refused by the safe \\(weights-only\\) loader"


ATTACKS = [_lists_no_files, _omits_metadata, _lacks_sharded_files, _only_a_version, _listed_with_its_true_hash,
           _flipped_shard_dropped_from_the_manifest, _evil_stored_value]


def _consolidate(folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "trainer", "consolidate", str(folder), str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.__name__.strip("_") for a in ATTACKS])
def test_consolidate_runs_nothing_from_a_crafted_folder(tmp_path: Path, good_folder: Path, attack: Any):
    folder = tmp_path / "crafted.ckpt"
    shutil.copytree(good_folder, folder)
    sentinel = tmp_path / "pwned"
    message = attack(folder, sentinel)
    started = time.perf_counter()
    result = _consolidate(folder, tmp_path / "out.ckpt")
    elapsed = time.perf_counter() - started
    assert not sentinel.exists(), "the folder ran code"
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trainer consolidate: error: {folder}"), result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "out.ckpt").exists()
    assert elapsed < 60


def test_the_good_folder_still_consolidates_and_the_versions_agree(tmp_path: Path, good_folder: Path):
    result = _consolidate(good_folder, tmp_path / "one.ckpt")
    assert result.returncode == 0, result.stderr
    assert "layer.weight" in torch.load(tmp_path / "one.ckpt", weights_only=True)["state_dict"]
    assert FORMAT_VERSION in READABLE_FORMAT_VERSIONS


def test_a_two_rank_zero3_fit_refuses_a_crafted_folder_on_every_rank(tmp_path: Path, good_folder: Path):
    folder = tmp_path / "crafted.ckpt"
    shutil.copytree(good_folder, folder)
    sentinel = tmp_path / "pwned"
    _omits_metadata(folder, sentinel)
    results = run_distributed(_fit_rank, str(tmp_path), str(folder), timeout=150)
    assert not sentinel.exists(), "the folder ran code"
    for result in results:
        assert result.startswith(f"CheckpointLoadError: {folder} was refused before anything in it was unpickled: "
                                 "its manifest.pt does not list DCP's .metadata"), result
    folder = tmp_path / "evil_value.ckpt"
    shutil.copytree(good_folder, folder)
    _evil_stored_value(folder, sentinel)
    for result in run_distributed(_fit_rank, str(tmp_path), str(folder), timeout=150):
        assert result.startswith(f"CheckpointLoadError: {folder}: the sharded checkpoint could not be read"), result
        assert "refused by the safe (weights-only) loader" in result, result
    assert not sentinel.exists(), "the folder ran code"
