"""ZeRO stages 1-3 on 2 gloo CPU ranks: parity with DDP, one unchanged module, and checkpoints."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from strategies import DDPStrategy, ZeroStrategy
from strategies.fsdp import FSDPStrategy
from strategies.zero import zero_optimizer_kwargs
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from tests.trainer.test_resume import Interrupted, SaveAndStop
from trainer import Trainer, TrainModule, seed_everything
from trainer.exceptions import ConfigError

pytestmark = pytest.mark.timeout(180)


class Net(TrainModule):
    """Unchanged across strategies: nothing in it knows about sharding."""

    def __init__(self, optimizer: str = "adamw") -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
        self.optimizer = optimizer
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self) -> Any:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        opt = torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.01)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 5, 0.5),
                                                   "interval": "step"}}


def _fit(strategy: Any, optimizer: str, callbacks: list | None = None, ckpt: str | None = None,
         max_steps: int = 20) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], Trainer]:
    seed_everything(0)
    model = Net(optimizer)
    trainer = Trainer(max_steps=max_steps, accumulate_grad_batches=2, gradient_clip_val=0.5, callbacks=callbacks,
                      **{**QUIET, "devices": 2, "strategy": strategy})
    try:
        trainer.fit(model, DataLoader(regression_data(n=160), batch_size=4, shuffle=True), ckpt_path=ckpt)
    except Interrupted:
        pass
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    return {k: v.detach().clone() for k, v in state.items()}, model.losses, trainer


def _parity_rank(rank: int, optimizer: str) -> dict[str, dict[str, torch.Tensor]]:
    return {s: _fit(s, optimizer)[0] for s in ("ddp", "zero1", "zero2", "zero3")}


@pytest.mark.distributed
@pytest.mark.parametrize("optimizer", [pytest.param("sgd", marks=pytest.mark.smoke), "adamw"])  # ZeRO in make check
def test_every_stage_matches_ddp(optimizer: str):
    for rank_result in run_distributed(_parity_rank, optimizer, timeout=150):
        ddp = rank_result["ddp"]
        for stage in ("zero1", "zero2", "zero3"):
            for key, value in ddp.items():
                torch.testing.assert_close(rank_result[stage][key], value, rtol=0, atol=1e-6, msg=f"{stage} {key}")


def _resume_rank(rank: int, stage: str, folder: str) -> tuple[list[torch.Tensor], list[torch.Tensor], dict, dict]:
    path = Path(folder) / f"{stage}.ckpt"
    reference, ref_losses, _ = _fit(stage, "adamw")
    # zero1 stops inside an accumulation window (batch 13); FSDP2 keeps a window's unsynced gradients in its
    # own buffers, so zero2/3 stop at a window boundary (batch 14) and warn about mid-window saves.
    stop = 13 if stage == "zero1" else 14
    _, first, _ = _fit(stage, "adamw", callbacks=[SaveAndStop(stop, path)])
    resumed, second, _ = _fit(stage, "adamw", ckpt=str(path))
    return ref_losses, first + second, reference, resumed


@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_each_stage_resumes_bit_exactly(tmp_path: Path, stage: str):
    for ref_losses, losses, reference, resumed in run_distributed(_resume_rank, stage, str(tmp_path), timeout=150):
        assert len(losses) == len(ref_losses) == 40
        assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses, strict=True))
        for key, value in reference.items():
            assert torch.equal(resumed[key], value), key


class RecordsComputeDtype(Net):
    def __init__(self) -> None:
        super().__init__("adamw")
        self.dtypes: set[torch.dtype] = set()
        self.net[0].register_forward_pre_hook(lambda module, args: self.dtypes.add(module.weight.dtype))


def _bf16_zero3_rank(rank: int) -> tuple[set[torch.dtype], torch.dtype, bool]:
    model = RecordsComputeDtype()
    Trainer(max_steps=3, **{**QUIET, "devices": 2, "strategy": "zero3", "precision": "bf16-mixed"}).fit(
        model, DataLoader(regression_data(n=64), batch_size=4))
    weight = model.net[0].weight
    return model.dtypes, weight.dtype, bool(torch.isfinite(model.losses[-1]))


@pytest.mark.distributed
def test_bf16_mixed_under_zero3_gathers_bf16_parameters_and_keeps_fp32_shards():
    for dtypes, stored, finite in run_distributed(_bf16_zero3_rank):
        assert dtypes == {torch.bfloat16} and stored == torch.float32 and finite


def test_zero_flags_and_errors():
    assert isinstance(Trainer(strategy="zero3", accelerator="cpu", devices=2).strategy, ZeroStrategy)
    with pytest.raises(ConfigError, match=r"precision='16-mixed' is not supported by zero3"):
        Trainer(strategy="zero3", accelerator="cpu", devices=2, precision="16-mixed")
    with pytest.raises(ConfigError, match=r"stage=4"):
        ZeroStrategy(stage=4)
    with pytest.raises(ConfigError, match=r"does not use DDP options \['find_unused_parameters'\]"):
        ZeroStrategy(stage=3, find_unused_parameters=True)
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=0.1)
    assert "lr" in zero_optimizer_kwargs(opt) and "differentiable" in zero_optimizer_kwargs(opt)


@pytest.mark.parametrize(("stage", "mechanism"), [(1, DDPStrategy), (2, FSDPStrategy), (3, FSDPStrategy)])
def test_each_stage_is_an_instance_of_its_mechanism_and_survives_pickling(stage: int, mechanism: type):
    """The stage is settled at construction; ddp_spawn sends the strategy to the ranks as pickle bytes."""
    strategy = pickle.loads(pickle.dumps(ZeroStrategy(stage=stage)))
    assert isinstance(strategy, ZeroStrategy) and isinstance(strategy, mechanism) and strategy.stage == stage
    if stage > 1:
        assert strategy.reshard_after_forward == (stage == 3)


def test_zero1_refuses_fsdp_options_instead_of_ignoring_them():
    with pytest.raises(ConfigError, match=r"shard_modules=...\) chooses FSDP2 units: it needs stage 2 or 3"):
        ZeroStrategy(stage=1, shard_modules=(nn.Linear,))
    with pytest.raises(ConfigError, match=r"sharded_checkpoint=True\) needs stage 2 or 3"):
        ZeroStrategy(stage=1, sharded_checkpoint=True)


def _save_zero3_rank(rank: int, folder: str) -> None:
    _, _, trainer = _fit("zero3", "adamw")
    trainer.save_checkpoint(Path(folder) / "zero3.ckpt")


def _load(strategy: str, path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Resume with max_steps already reached: nothing trains, so the states are exactly what was loaded."""
    state, _, trainer = _fit(strategy, "adamw", ckpt=str(path))
    optimizer_state = trainer.strategy.optimizer_state_dict(trainer.optimizers[0])  # collective under zero1
    return state, optimizer_state


def _load_zero1_rank(rank: int, path: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return _load("zero1", Path(path))


@pytest.mark.distributed
def test_zero3_checkpoint_loads_on_one_device_and_in_a_zero1_run(tmp_path: Path):
    run_distributed(_save_zero3_rank, str(tmp_path), timeout=150)
    path = tmp_path / "zero3.ckpt"
    saved = torch.load(path, weights_only=True)
    seed_everything(1)
    single = Net("adamw")
    trainer = Trainer(max_steps=20, accumulate_grad_batches=2, **QUIET)
    with pytest.warns(UserWarning, match=r"saved by 2 rank\(s\), this run has 1: per-rank RNG states are not"):
        trainer.fit(single, DataLoader(regression_data(n=160), batch_size=8), ckpt_path=path)
    zero1_rank0, _ = run_distributed(_load_zero1_rank, str(path), timeout=150)
    for key, value in saved["state_dict"].items():
        assert torch.equal(single.state_dict()[key], value), key
        assert torch.equal(zero1_rank0[0][key], value), key
    saved_opt = saved["optimizer_states"][0]["state"]
    for loaded in (trainer.optimizers[0].state_dict()["state"], zero1_rank0[1]["state"]):
        assert loaded.keys() == saved_opt.keys()
        for index, tensors in saved_opt.items():
            for name, tensor in tensors.items():
                assert torch.equal(loaded[index][name], tensor), (index, name)


def _sharded(stage: int = 3) -> ZeroStrategy:
    return ZeroStrategy(stage=stage, sharded_checkpoint=True)


def _sharded_resume_rank(rank: int, folder: str) -> tuple[list, list, dict, dict, list[str]]:
    path = Path(folder) / "sharded.ckpt"
    reference, ref_losses, _ = _fit(_sharded(), "adamw")
    _, first, _ = _fit(_sharded(), "adamw", callbacks=[SaveAndStop(14, path)])
    names = sorted(p.name for p in path.iterdir())
    resumed, second, _ = _fit(_sharded(), "adamw", ckpt=str(path))
    return ref_losses, first + second, reference, resumed, names


@pytest.mark.distributed
def test_sharded_checkpoint_folder_resumes_bit_exactly(tmp_path: Path):
    for ref_losses, losses, reference, resumed, names in run_distributed(_sharded_resume_rank, str(tmp_path),
                                                                         timeout=150):
        assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.pt"]
        assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses, strict=True)) and len(losses) == 40
        for key, value in reference.items():
            assert torch.equal(resumed[key], value), key


def _broken_load_rank(rank: int, folder: str) -> str:
    try:
        _fit(_sharded(), "adamw", ckpt=folder)
    except Exception as err:  # noqa: BLE001 - the test inspects the message each rank got
        return f"{type(err).__name__}: {err}"
    return "loaded"


def _save_sharded_rank(rank: int, folder: str) -> dict[str, torch.Tensor]:
    state, _, trainer = _fit(_sharded(), "adamw", max_steps=4)
    trainer.save_checkpoint(Path(folder) / "good.ckpt")
    return state


def _load_one_rank(rank: int, folder: str) -> dict[str, torch.Tensor]:
    seed_everything(3)
    model = Net("adamw")
    trainer = Trainer(max_steps=4, **{**QUIET, "devices": 1, "strategy": _sharded()})
    trainer.fit(model, DataLoader(regression_data(n=160), batch_size=8), ckpt_path=folder)  # nothing trains
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


@pytest.mark.distributed
def test_sharded_folder_from_two_ranks_loads_at_world_size_one(tmp_path: Path):
    saved, _ = run_distributed(_save_sharded_rank, str(tmp_path), timeout=150)
    (loaded,) = run_distributed(_load_one_rank, str(tmp_path / "good.ckpt"), world_size=1, timeout=150)
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key


@pytest.mark.distributed
def test_damaged_sharded_folders_fail_on_every_rank_without_hanging(tmp_path: Path):
    run_distributed(_save_sharded_rank, str(tmp_path), timeout=150)
    good = tmp_path / "good.ckpt"
    no_manifest, missing_shard, foreign = (tmp_path / n for n in ("no_manifest", "missing_shard", "foreign"))
    for target in (no_manifest, missing_shard, foreign):
        shutil.copytree(good, target)
    (no_manifest / "manifest.pt").unlink()
    (missing_shard / "__1_0.distcp").unlink()
    (foreign / ".metadata").write_bytes(b"not ours")  # would be unpickled by DCP without the sha256 check
    for folder, message in ((no_manifest, "has no manifest.pt"), (missing_shard, "missing the shard file __1_0"),
                            (foreign, ".metadata does not match the sha256")):
        for result in run_distributed(_broken_load_rank, str(folder), timeout=60):
            assert result.startswith("CheckpointLoadError") and message in result, result


class ScaledNet(Net):
    """Owns a parameter directly, so under FSDP2 it belongs to the root unit (the step router), not to a child."""

    def __init__(self) -> None:
        super().__init__("sgd")
        self.scale = nn.Parameter(torch.full((1,), 0.5))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x) * self.scale, y)


def _root_unit_rank(rank: int) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for strategy in ("ddp", "zero3"):
        seed_everything(0)
        model = ScaledNet()
        Trainer(max_steps=4, **{**QUIET, "devices": 2, "strategy": strategy}).fit(
            model, DataLoader(regression_data(n=32), batch_size=4, shuffle=True))
        out[strategy] = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                         for k, v in model.state_dict().items()}
    return out


@pytest.mark.distributed
def test_root_unit_parameters_are_gathered_in_forward():
    """The router is called through __call__, so FSDP2's root hooks gather parameters the TrainModule owns itself
    (they once stayed sharded DTensors in forward: 'got mixed torch.Tensor and DTensor')."""
    for rank_result in run_distributed(_root_unit_rank, timeout=150):
        for key, value in rank_result["ddp"].items():
            torch.testing.assert_close(rank_result["zero3"][key], value, rtol=0, atol=1e-6, msg=key)


class _Evaluated(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self.net(batch[0])


def _uneven_evaluation_rank(rank: int, stage: str) -> tuple[list[dict[str, float]], torch.Tensor]:
    trainer = Trainer(**{**QUIET, "devices": 2, "strategy": stage})
    loader = DataLoader(regression_data(n=5), batch_size=2)  # unpadded, rank 0 would run 2 batches and rank 1 one
    metrics = trainer.validate(_Evaluated(), loader, verbose=False)
    return metrics, torch.cat(trainer.predict(_Evaluated(), loader))


@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_evaluation_with_uneven_shards_finishes_under_fsdp(stage: str):
    """FSDP2's forward is a collective: every rank gets as many evaluation batches (a few samples twice), so a rank
    never waits in a forward the other ran out of data for; predictions still come back once per sample."""
    expected = _Evaluated().net(regression_data(n=5).tensors[0])
    for metrics, predictions in run_distributed(_uneven_evaluation_rank, stage, timeout=150):
        assert set(metrics[0]) == {"val_loss"}
        torch.testing.assert_close(predictions, expected)
