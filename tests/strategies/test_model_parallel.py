"""ModelParallelStrategy (tensor x data parallel on a DTensor device mesh) on gloo CPU ranks.

Four ranks on two cores are slow, so the 4-rank launches are few: one runs every mesh shape (2x2, 1x4, 4x1) against
one process (the parametrised parity test reads it), one resumes, one loads across meshes; the fault test is in
tests/reliability/test_faults.py. The errors that need running ranks share one 2-rank launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from strategies import ModelParallelStrategy
from strategies.exceptions import CheckpointLoadError, ConfigError, MisconfigurationError
from strategies.model import dtensor
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from tests.helpers.launch import REPO, assert_ok, clean_env, launch
from tests.helpers.runif import run_if
from tests.helpers.tensor_parallel import TinyTransformer, full_state, loader
from tests.trainer.test_resume import Interrupted, SaveAndStop
from trainer import Trainer, seed_everything

GLOBAL_BATCH = 8
MESHES = {"2x2": (2, 2), "1x4": (1, 4), "4x1": (4, 1)}
CPU4 = {**QUIET, "devices": 4}


# --- construction: no rank is started ------------------------------------------------------------------------
def test_the_sizes_must_multiply_to_the_world_size_before_any_rank_starts():
    with pytest.raises(ConfigError, match=r"data_parallel_size=3, tensor_parallel_size=2\) does not fit 4 rank"):
        Trainer(accelerator="cpu", devices=4, strategy=ModelParallelStrategy(3, 2))
    with pytest.raises(ConfigError, match=r"data_parallel_size=3, tensor_parallel_size='auto'\) does not fit 4"):
        Trainer(accelerator="cpu", devices=4, strategy=ModelParallelStrategy(data_parallel_size=3))
    for bad in (0, "two", 1.5, True):
        with pytest.raises(ConfigError, match="give an int >= 1 or 'auto'"):
            ModelParallelStrategy(tensor_parallel_size=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("dp", "tp", "shape"), [("auto", "auto", (1, 4)), (2, "auto", (2, 2)), ("auto", 1, (4, 1))])
def test_auto_sizes_follow_lightning_and_the_other_size(dp: Any, tp: Any, shape: tuple[int, int]):
    """Both "auto": data parallel over nodes, tensor parallel over a node's devices (Lightning's rule); one given:
    the other is the world size divided by it (Lightning would refuse dp=2 with tp="auto" on 4 devices)."""
    strategy = Trainer(accelerator="cpu", devices=4, strategy=ModelParallelStrategy(dp, tp)).strategy
    assert (strategy.data_parallel_size, strategy.tensor_parallel_size) == shape


def test_by_name_precisions_and_checkpoint_flag():
    strategy = Trainer(accelerator="cpu", devices=2, strategy="model_parallel").strategy
    assert isinstance(strategy, ModelParallelStrategy) and strategy.sharded_checkpoint is True  # Lightning's default
    Trainer(accelerator="cpu", devices=2, strategy="model_parallel", precision="bf16-mixed")
    for refused in ("16-mixed", "64-true", "16-true"):
        with pytest.raises(ConfigError, match=rf"precision='{refused}' is not supported by ModelParallelStrategy; "
                                              r"it supports: 32-true, bf16-mixed, bf16-true"):
            Trainer(accelerator="cpu", devices=2, strategy="model_parallel", precision=refused)
    with pytest.raises(ConfigError, match=r"save_distributed_checkpoint='yes' is not valid"):
        ModelParallelStrategy(save_distributed_checkpoint="yes")


def test_ranks_of_one_tensor_parallel_group_get_the_same_data_shard():
    strategy = Trainer(accelerator="cpu", devices=4, strategy=ModelParallelStrategy(2, 2)).strategy
    shards = []
    for rank in range(4):
        strategy.global_rank = rank
        shards.append(strategy.distributed_sampler_kwargs)
    assert shards == [{"num_replicas": 2, "rank": 0}] * 2 + [{"num_replicas": 2, "rank": 1}] * 2


def test_device_mesh_before_the_ranks_start_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"exists once the ranks have started: read it in configure_model"):
        ModelParallelStrategy().device_mesh  # noqa: B018


def test_clip_grad_norm_over_plain_gradients_is_torchs():
    torch.manual_seed(0)
    grads = [torch.randn(5, 3), torch.randn(7)]
    expected = [g.clone() for g in grads]
    params = [nn.Parameter(torch.zeros_like(g)) for g in expected]
    for p, g in zip(params, expected, strict=True):
        p.grad = g
    want = torch.nn.utils.clip_grad_norm_(params, 0.5)
    got = dtensor.clip_grad_norm(grads, 0.5)
    torch.testing.assert_close(got, want)
    for g, p in zip(grads, params, strict=True):
        torch.testing.assert_close(g, p.grad)


def test_clipping_by_value_clamps_every_gradient():
    params = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))]
    params[0].grad, params[1].grad = torch.tensor([-2.0, 0.1, 3.0]), torch.tensor([0.4, -0.7])
    optimizer = torch.optim.SGD(params, lr=0.1)
    assert ModelParallelStrategy().clip_gradients(optimizer, max_value=0.5) is None
    assert params[0].grad.tolist() == [-0.5, pytest.approx(0.1), 0.5]
    assert params[1].grad.tolist() == [pytest.approx(0.4), -0.5]


# --- parity: every mesh shape against one process, in one 4-rank launch -------------------------------------------
def _fit(strategy: Any, batch_size: int, optimizer: str = "sgd", max_steps: int = 6, ckpt_path: Any = None,
         shuffle: bool = False, **flags: Any) -> tuple[TinyTransformer, Trainer]:
    """Seeded fit of the tiny transformer; a SaveAndStop callback ends it early (the model is returned anyway)."""
    seed_everything(0)
    model = TinyTransformer(optimizer=optimizer)
    trainer = Trainer(max_steps=max_steps, gradient_clip_val=0.1, **{**CPU4, **flags, "strategy": strategy})
    try:
        trainer.fit(model, loader(batch_size, shuffle=shuffle), ckpt_path=ckpt_path)
    except Interrupted:
        pass
    return model, trainer


def _parity_rank(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (dp, tp) in MESHES.items():
        model, trainer = _fit(ModelParallelStrategy(dp, tp), GLOBAL_BATCH // dp)
        out[name] = {"weights": full_state(model), "batch_sums": model.batch_sums,
                     "samples": float(trainer.callback_metrics["samples"])}
        out[name]["val_loss"] = trainer.validate(model, loader(GLOBAL_BATCH // dp, n=24), verbose=False)[0]["val_loss"]
    model, _ = _fit(ModelParallelStrategy(2, 2), GLOBAL_BATCH // 2, max_steps=2, precision="bf16-mixed")
    out["bf16-mixed"] = {"dtypes": model.logit_dtypes, "finite": all(torch.isfinite(x) for x in model.losses)}
    return out


@pytest.fixture(scope="module")
def parity() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(every rank's results, one process's) for the same seed, data and global batches."""
    ranks = run_distributed(_parity_rank, world_size=4, timeout=240)
    model, trainer = _fit("single", GLOBAL_BATCH, devices=1)
    val = trainer.validate(model, loader(GLOBAL_BATCH, n=24), verbose=False)[0]["val_loss"]
    return ranks, {"weights": full_state(model), "batch_sums": model.batch_sums, "val_loss": val}


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_each_mesh_trains_like_one_process_on_the_same_global_batches(parity: Any, mesh: str):
    """SGD with momentum and gradient clipping (on DTensor gradients of several meshes): the weights of every rank
    match one process within float rounding; ranks of one tensor-parallel group saw the same batches, the
    data-parallel groups together the global batch; sync_dist sums over the data-parallel replicas only."""
    ranks, single = parity
    dp, tp = MESHES[mesh]
    for rank, result in enumerate(ranks):
        got = result[mesh]
        for key, value in single["weights"].items():
            torch.testing.assert_close(got["weights"][key], value, rtol=0, atol=2e-7, msg=f"rank {rank} {key}")
        assert got["batch_sums"] == ranks[rank - rank % tp][mesh]["batch_sums"]  # as its tensor-parallel group
        assert got["samples"] == GLOBAL_BATCH
        torch.testing.assert_close(torch.tensor(got["val_loss"]), torch.tensor(single["val_loss"]))
    per_group = [ranks[group * tp][mesh]["batch_sums"] for group in range(dp)]
    assert [sum(step) for step in zip(*per_group, strict=True)] == single["batch_sums"]


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_bf16_mixed_computes_in_bf16_on_a_2x2_mesh(parity: Any):
    for result in parity[0]:
        assert result["bf16-mixed"] == {"dtypes": {torch.bfloat16}, "finite": True}


# --- resume and cross-mesh loads -----------------------------------------------------------------------------
def _resume_rank(rank: int, folder: str) -> tuple[list, list, dict, dict, list[str]]:
    path = Path(folder) / "mid.ckpt"
    run = {"batch_size": 4, "optimizer": "adamw", "max_steps": 12, "shuffle": True}
    reference, _ = _fit(ModelParallelStrategy(2, 2), **run)
    first, _ = _fit(ModelParallelStrategy(2, 2), **run, callbacks=[SaveAndStop(5, path)])  # 8 steps an epoch
    names = sorted(p.name for p in path.iterdir())
    seed_everything(7)  # the checkpoint's RNG states must win
    resumed = TinyTransformer(optimizer="adamw")
    Trainer(max_steps=12, gradient_clip_val=0.1, **{**CPU4, "strategy": ModelParallelStrategy(2, 2)}).fit(
        resumed, loader(4, shuffle=True), ckpt_path=str(path))
    return reference.losses, first.losses + resumed.losses, full_state(reference), full_state(resumed), names


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_resume_from_a_sharded_folder_mid_epoch_continues_exactly(tmp_path: Path):
    for ref_losses, losses, reference, resumed, names in run_distributed(_resume_rank, str(tmp_path), world_size=4,
                                                                         timeout=240):
        assert names == [".metadata", *(f"__{r}_0.distcp" for r in range(4)), "manifest.pt"]
        assert len(losses) == len(ref_losses) == 12
        assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses, strict=True))
        assert all(torch.equal(resumed[k], v) for k, v in reference.items())


def _cross_mesh_rank(rank: int, folder: str) -> dict[str, Any]:
    path = Path(folder) / "mp.ckpt"
    run = {"optimizer": "adamw", "max_steps": 12}
    saved, _ = _fit(ModelParallelStrategy(2, 2), 4, **run, callbacks=[SaveAndStop(5, path)])  # mid-epoch
    loaded, trainer = _fit(ModelParallelStrategy(1, 4), 8, **{**run, "max_steps": 5}, ckpt_path=str(path))
    optimizer = dtensor.optimizer_state(trainer.strategy.model, trainer.optimizers[0], full=True)  # on rank 0
    try:  # more to train: the unfinished epoch's order depends on the data split, which the mesh changed
        _fit(ModelParallelStrategy(1, 4), 8, **run, ckpt_path=str(path))
        refusal = "resumed"
    except CheckpointLoadError as err:
        refusal = str(err)
    return {"saved": full_state(saved), "loaded": full_state(loaded), "optimizer": optimizer, "refusal": refusal}


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_2x2_checkpoint_loads_on_1x4_and_on_one_process_with_the_same_weights(tmp_path: Path):
    from trainer.cli.consolidate import main as consolidate_main

    results = run_distributed(_cross_mesh_rank, str(tmp_path), world_size=4, timeout=240)
    saved = results[0]["saved"]
    for result in results:
        assert all(torch.equal(result["loaded"][k], v) for k, v in saved.items())
        assert "saved mid-epoch with the data split 2 way(s) over 4 rank(s), this run splits it 1 way(s)" in \
            result["refusal"], result["refusal"]
    file = tmp_path / "one.ckpt"
    consolidate_main([str(tmp_path / "mp.ckpt"), str(file)])  # `python -m trainer consolidate FOLDER FILE`
    single = TinyTransformer.load_from_checkpoint(file)
    assert all(torch.equal(single.state_dict()[k], v) for k, v in saved.items())
    stored = torch.load(file, weights_only=True)["optimizer_states"][0]["state"]
    one_by_four = results[0]["optimizer"]["state"]
    assert stored.keys() == one_by_four.keys() and len(stored) == len(saved)
    for index, tensors in stored.items():
        assert all(torch.equal(one_by_four[index][name], t) for name, t in tensors.items()), index


# --- what configure_model must do, checked on running ranks ------------------------------------------------------
class Unparallelized(BoringModel):
    pass


class AlreadyWrapped(BoringModel):
    def configure_model(self) -> None:
        self.layer = nn.DataParallel(nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class Parallelized(BoringModel):
    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        from torch.distributed.tensor.placement_types import Replicate

        parallelize_module(self.layer, self.device_mesh["tensor_parallel"], ColwiseParallel(output_layouts=Replicate()))


def _errors_rank(rank: int) -> list[str]:
    messages = []
    for model in (Unparallelized(), AlreadyWrapped(), torch.compile(Parallelized())):
        try:
            Trainer(max_steps=1, **{**QUIET, "devices": 2, "strategy": "model_parallel"}).fit(model)
            messages.append("trained")
        except (ConfigError, MisconfigurationError) as err:
            messages.append(f"{type(err).__name__}: {err}")
    return messages


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_model_it_cannot_train_is_a_clear_error_on_every_rank():
    for messages in run_distributed(_errors_rank, timeout=100):
        nothing, wrapped, compiled = messages
        assert nothing.startswith("ConfigError: ModelParallelStrategy: configure_model() of Unparallelized "
                                  "parallelized nothing (no parameter is a DTensor)"), nothing
        assert "AlreadyWrapped.layer is already wrapped in DataParallel" in wrapped, wrapped
        assert "torch.compile(model)) is not supported with ModelParallelStrategy: compile the blocks" in compiled


# --- CUDA: the same parity over NCCL, where 4 GPUs exist -----------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.distributed
@pytest.mark.timeout(300)
@run_if(min_cuda_gpus=4)
def test_a_2x2_mesh_on_four_gpus_over_nccl_trains_like_one_gpu(tmp_path: Path):
    """Our launcher starts 4 ranks on 4 GPUs (NCCL); their weights match one GPU's on the same global batches."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "scripts"))
    from model_parallel_fit import GLOBAL_BATCH as BATCH
    from model_parallel_fit import fit

    out = tmp_path / "out"
    script = [sys.executable, str(REPO / "tests" / "scripts" / "model_parallel_fit.py"), "--out", str(out),
              "--accelerator", "gpu", "--devices", "4", "--data-parallel", "2"]
    assert_ok(launch([(script, clean_env())], out, timeout=240))
    saved = torch.load(out / "weights.pt", weights_only=True)
    assert saved["backend"] == "nccl"
    model, _ = fit("single", "gpu", 1, BATCH)
    for key, value in full_state(model).items():
        torch.testing.assert_close(saved["weights"][key], value.cpu(), rtol=1e-4, atol=1e-5, msg=key)
