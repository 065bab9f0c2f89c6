"""Asynchronous sharded saves (`sharded_checkpoint="async"`) and `trainer consolidate`, on 2 gloo CPU ranks.

An async run writes the same checkpoints as a synchronous one (tensors `torch.equal`, step by step: the staging copy
is taken at the save, not later), replaced top-k folders are deleted only after their successor committed, a
background write error fails the run on every rank, and a save cut short by an exception is committed before the
rank leaves. The kill-during-save trial of the async path is FI-11 in tests/reliability/test_faults.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import ModelCheckpoint
from strategies import ZeroStrategy
from strategies.checkpoint_io.sharded.consolidate import consolidated
from strategies.checkpoint_io.sharded.manifest import verify_folder
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from tests.strategies.test_zero import Net, _fit
from tests.trainer.test_resume import SaveAndStop
from trainer import Trainer, seed_everything
from trainer.exceptions import ConfigError

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]


def _ckpt_fit(mode: Any, dirpath: Path, **checkpoint: Any) -> tuple[dict[str, torch.Tensor], Trainer]:
    seed_everything(0)
    model = Net("adamw")
    trainer = Trainer(max_steps=12, accumulate_grad_batches=2, **{**QUIET, "devices": 2, "enable_checkpointing": True,
                                                                  "strategy": ZeroStrategy(stage=3,
                                                                                           sharded_checkpoint=mode)},
                      callbacks=[ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, **checkpoint)])
    trainer.fit(model, DataLoader(regression_data(n=160), batch_size=4, shuffle=True))
    return {k: v.full_tensor() for k, v in model.state_dict().items()}, trainer


def _sync_and_async_rank(rank: int, folder: str) -> tuple[dict, dict]:
    sync, _ = _ckpt_fit(True, Path(folder) / "sync", save_top_k=-1)
    async_, _ = _ckpt_fit("async", Path(folder) / "async", save_top_k=-1)
    _ckpt_fit("async", Path(folder) / "top1", save_top_k=1)
    return sync, async_


def _assert_same_checkpoint(a: dict[str, Any], b: dict[str, Any], where: str) -> None:
    assert a["global_step"] == b["global_step"], where
    assert a["state_dict"].keys() == b["state_dict"].keys(), where
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), (where, key)
    for opt_a, opt_b in zip(a["optimizer_states"], b["optimizer_states"], strict=True):
        assert opt_a["param_groups"] == opt_b["param_groups"], where
        for index, tensors in opt_a["state"].items():
            for name, tensor in tensors.items():
                assert torch.equal(tensor, opt_b["state"][index][name]), (where, index, name)


@pytest.mark.distributed
def test_async_saves_equal_synchronous_ones_and_replace_top_k_after_commit(tmp_path: Path):
    for sync, async_ in run_distributed(_sync_and_async_rank, str(tmp_path), timeout=200):
        for key, value in sync.items():  # the background writes do not change training
            assert torch.equal(async_[key], value), key
    names = sorted(p.name for p in (tmp_path / "sync").iterdir())
    assert len(names) == 6, names  # every 2 steps of 12
    assert sorted(p.name for p in (tmp_path / "async").iterdir()) == names  # every save committed, no temp left
    for name in names:
        assert verify_folder(tmp_path / "async" / name) is None, name
        _assert_same_checkpoint(consolidated(tmp_path / "sync" / name), consolidated(tmp_path / "async" / name),
                                name)
    assert [p.name for p in (tmp_path / "top1").iterdir()] == [max(names, key=lambda n: int(n.split("=")[-1][:-5]))]


def _failing_commit_rank(rank: int, folder: str) -> str:
    import strategies.checkpoint_io.sharded.folder as sharded

    if rank == 0:
        def no_commit(*args: Any) -> None:
            raise OSError(28, "No space left on device")

        sharded._commit = no_commit
    try:
        _ckpt_fit("async", Path(folder), save_top_k=-1)
    except Exception as err:  # noqa: BLE001 - the test inspects what each rank raised
        return f"{type(err).__name__}: {err}"
    return "finished"


@pytest.mark.distributed
def test_a_failed_background_write_fails_every_rank_at_the_next_save(tmp_path: Path):
    for result in run_distributed(_failing_commit_rank, str(tmp_path), timeout=120):
        assert result.startswith("CheckpointSaveError") and "could not commit" in result, result
        assert "No space left on device" in result and "rank 0:" in result, result
    assert not [p for p in tmp_path.iterdir() if ".tmp-" not in p.name]  # nothing was committed


def _stopped_rank(rank: int, folder: str) -> tuple[list, dict, dict]:
    path = Path(folder) / "stopped.ckpt"
    strategy = ZeroStrategy(stage=3, sharded_checkpoint="async")
    reference, ref_losses, _ = _fit(ZeroStrategy(stage=3, sharded_checkpoint=True), "adamw")
    _, first, _ = _fit(strategy, "adamw", callbacks=[SaveAndStop(14, path)])  # fit ends by an exception
    resumed, second, _ = _fit(ZeroStrategy(stage=3, sharded_checkpoint="async"), "adamw", ckpt=str(path))
    return [torch.equal(a, b) for a, b in zip(first + second, ref_losses, strict=True)], reference, resumed


@pytest.mark.distributed
def test_a_save_in_flight_when_fit_fails_is_committed_and_resumes_bit_exactly(tmp_path: Path):
    for equal, reference, resumed in run_distributed(_stopped_rank, str(tmp_path), timeout=200):
        assert all(equal) and len(equal) == 40
        for key, value in reference.items():
            assert torch.equal(resumed[key], value), key


def test_sharded_checkpoint_takes_true_false_or_async():
    with pytest.raises(ConfigError, match=r"sharded_checkpoint='later' is not valid: use False, True or 'async'"):
        ZeroStrategy(stage=3, sharded_checkpoint="later")


# --- consolidate ------------------------------------------------------------------------------------------------
def _save_rank(rank: int, folder: str) -> None:
    _fit(ZeroStrategy(stage=3, sharded_checkpoint=True), "adamw", max_steps=6)[2].save_checkpoint(
        Path(folder) / "sharded.ckpt")


def _load_sharded_one_rank(rank: int, folder: str) -> tuple[dict, dict]:
    seed_everything(3)
    model = Net("adamw")
    trainer = Trainer(max_steps=6, **{**QUIET, "strategy": ZeroStrategy(stage=3, sharded_checkpoint=True)})
    trainer.fit(model, DataLoader(regression_data(n=160), batch_size=8), ckpt_path=folder)  # nothing trains
    optimizer = trainer.strategy.optimizer_state_dict(trainer.optimizers[0])
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}, optimizer


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "consolidate", *args], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                          timeout=120)


@pytest.mark.distributed
def test_consolidate_writes_one_file_equal_to_the_shards_that_loads_on_one_device(tmp_path: Path):
    run_distributed(_save_rank, str(tmp_path), timeout=150)
    folder, file = tmp_path / "sharded.ckpt", tmp_path / "one.ckpt"
    done = _cli(str(folder), str(file))
    assert done.returncode == 0, done.stderr
    saved = torch.load(file, weights_only=True)
    ((shards, shard_opt),) = run_distributed(_load_sharded_one_rank, str(folder), world_size=1, timeout=150)
    assert saved["state_dict"].keys() == shards.keys()
    for key, value in shards.items():
        assert torch.equal(saved["state_dict"][key], value), key
    opt = saved["optimizer_states"][0]
    for index, tensors in shard_opt["state"].items():  # the strategy's sharded state, by parameter name
        position = [n for g in shard_opt["param_groups"] for n in g["params"]].index(index)
        for name, tensor in tensors.items():
            assert torch.equal(opt["state"][position][name], tensor.full_tensor() if hasattr(tensor, "full_tensor")
                               else tensor), (index, name)
    # one device, the default strategy: fit resumes from it (nothing left to train), and load_from_checkpoint
    seed_everything(5)
    model = Net("adamw")
    trainer = Trainer(max_steps=6, **QUIET)
    with pytest.warns(UserWarning, match=r"saved by 2 rank\(s\), this run has 1"):
        trainer.fit(model, DataLoader(regression_data(n=160), batch_size=8), ckpt_path=file)
    loaded = Net.load_from_checkpoint(file)
    for key, value in saved["state_dict"].items():
        assert torch.equal(model.state_dict()[key], value), key
        assert torch.equal(loaded.state_dict()[key], value), key
    single_opt = trainer.optimizers[0].state_dict()["state"]
    for position, tensors in opt["state"].items():
        for name, tensor in tensors.items():
            assert torch.equal(single_opt[position][name], tensor), (position, name)
    assert trainer.global_step == saved["global_step"] == 6


@pytest.mark.distributed
def test_consolidate_refuses_what_is_not_a_committed_sharded_folder(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain.ckpt").write_bytes(b"x")
    for target, message in ((tmp_path / "empty", "has no manifest.pt: it is not a committed checkpoint"),
                            (tmp_path / "plain.ckpt", "is a file: consolidate takes a sharded checkpoint folder"),
                            (tmp_path / "nope", "is not there")):
        done = _cli(str(target), str(tmp_path / "out.ckpt"))
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out.ckpt").exists()
    usage = _cli()
    assert usage.returncode == 2 and "consolidate" in usage.stderr, usage.stderr
