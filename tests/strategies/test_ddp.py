"""DDP on 2 CPU ranks with gloo: numerical parity with one process on the 2x batch, sync_dist,
sampler injection with set_epoch, uneven evaluation, and flag resolution for large clusters."""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils.data import DataLoader, Dataset

from callbacks import Callback
from strategies import DDPStrategy
from strategies.launch.devices import Hardware
from tests.helpers.boring import QUIET, BoringModel, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything
from trainer.loops.schedule import FitSchedule
from trainer.setup.flags import parse_flags

pytestmark = pytest.mark.timeout(120)
DDP = {**QUIET, "devices": 2, "strategy": "ddp"}


class Regression(TrainModule):
    def __init__(self, optimizer: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))
        self.optimizer = optimizer

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def _fit(optimizer: str, batch_size: int, accumulate: int, **flags: Any) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = Regression(optimizer)
    loader = DataLoader(regression_data(n=320), batch_size=batch_size)
    Trainer(max_steps=20, accumulate_grad_batches=accumulate, **flags).fit(model, loader)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _ddp_rank(rank: int, optimizer: str, accumulate: int) -> dict[str, torch.Tensor]:
    return _fit(optimizer, 4, accumulate, **DDP)


@pytest.mark.distributed
@pytest.mark.parametrize(("optimizer", "accumulate"), [("sgd", 1), ("adamw", 1), ("sgd", 2)])
def test_ddp_two_ranks_match_one_process_on_the_double_batch(optimizer: str, accumulate: int):
    ranks = run_distributed(_ddp_rank, optimizer, accumulate)
    single = _fit(optimizer, 8, accumulate, **QUIET)
    for key in single:
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks disagree on {key}"
        torch.testing.assert_close(ranks[0][key], single[key], rtol=1e-5, atol=1e-6)
    assert not torch.equal(single["net.0.weight"], Regression(optimizer).state_dict()["net.0.weight"])


class ManualRegression(Regression):
    """The same regression, stepped by hand: manual_backward runs inside DDP's forward."""

    def __init__(self, optimizer: str) -> None:
        super().__init__(optimizer)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss.detach()


def _manual_fit(rank: int, strategy: str, batch_size: int) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = ManualRegression("sgd")
    loader = DataLoader(regression_data(n=320), batch_size=batch_size)
    flags = {**DDP, "strategy": strategy} if strategy != "single" else QUIET
    Trainer(max_steps=20, **flags).fit(model, loader)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_manual_optimization_under_ddp_matches_one_process_on_the_double_batch(strategy: str):
    ranks = run_distributed(_manual_fit, strategy, 4)
    single = _manual_fit(0, "single", 8)
    for key in single:
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks disagree on {key}"
        torch.testing.assert_close(ranks[0][key], single[key], rtol=1e-5, atol=1e-6)


def _bf16_rank(rank: int) -> dict[str, torch.Tensor]:
    return _fit("adamw", 4, 1, **{**DDP, "precision": "bf16-mixed"})


@pytest.mark.distributed
def test_bf16_mixed_ddp_matches_one_process_within_bf16_tolerance():
    ranks = run_distributed(_bf16_rank)
    single = _fit("adamw", 8, 1, **{**QUIET, "precision": "bf16-mixed"})
    start = Regression("adamw").state_dict()
    for key in single:
        assert torch.equal(ranks[0][key], ranks[1][key])
        torch.testing.assert_close(ranks[0][key], single[key], rtol=2e-2, atol=2e-2)
    assert any(not torch.equal(single[k], start[k]) for k in single)


class LogsRank(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("synced", float(self.global_rank), on_step=False, on_epoch=True, sync_dist=True)
        self.log("local", float(self.global_rank), on_step=False, on_epoch=True)
        return super().training_step(batch, batch_idx)


def _sync_rank(rank: int) -> dict[str, float]:
    trainer = Trainer(max_epochs=1, limit_val_batches=0, **DDP)
    trainer.fit(LogsRank())
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.distributed
def test_sync_dist_gives_the_global_mean():
    rank0, rank1 = run_distributed(_sync_rank)
    assert rank0["synced"] == rank1["synced"] == 0.5
    assert (rank0["local"], rank1["local"]) == (0.0, 1.0)


class Indexed(Dataset):
    """Returns its index, so the test can see which samples each rank drew."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)] * 32)


class RecordsIndices(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen[-1] += [int(v) for v in batch[:, 0]]
        return super().training_step(batch, batch_idx)


def _epochs_rank(rank: int) -> list[list[int]]:
    seed_everything(3)
    model = RecordsIndices()
    Trainer(max_epochs=2, limit_val_batches=0, **DDP).fit(model, DataLoader(Indexed(20), batch_size=5, shuffle=True))
    return model.seen


@pytest.mark.distributed
def test_injected_sampler_partitions_the_data_and_reshuffles_each_epoch():
    rank0, rank1 = run_distributed(_epochs_rank)
    for epoch in range(2):
        assert sorted(rank0[epoch] + rank1[epoch]) == list(range(20))
    assert rank0[0] != rank0[1] and rank1[0] != rank1[1]


class MeanOfInputs(BoringModel):
    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("mean_x", batch[:, 0].mean(), sync_dist=True)


def _uneven_rank(rank: int) -> tuple[list[dict[str, float]], int]:
    loader = DataLoader(Indexed(7), batch_size=2)
    trainer = Trainer(**DDP)
    metrics = trainer.validate(MeanOfInputs(), loader)
    predictions = trainer.predict(BoringModel(), loader)
    return metrics, sum(len(p) for p in predictions)


@pytest.mark.distributed
def test_evaluation_over_an_uneven_split_counts_each_sample_once():
    (m0, n0), (m1, n1) = run_distributed(_uneven_rank)
    single = Trainer(**QUIET).validate(MeanOfInputs(), DataLoader(Indexed(7), batch_size=2))
    assert single == [{"mean_x": 3.0}]
    assert m0[0]["mean_x"] == pytest.approx(3.0, rel=1e-6) and m1[0]["mean_x"] == pytest.approx(3.0, rel=1e-6)
    assert (n0, n1) == (7, 7)  # each rank predicted its shard (4 and 3 samples); predict() returns all of them


def test_gpus_8_num_nodes_4_resolves_to_32_ranks_without_starting_anything():
    spec = parse_flags(gpus=8, num_nodes=4, hardware=Hardware(cuda_device_count=8, mps_available=False))
    strategy = spec.strategy
    assert isinstance(strategy, DDPStrategy) and strategy.process_group_backend == "nccl"
    assert strategy.world_size == 32 and spec.devices == tuple(torch.device("cuda", i) for i in range(8))
    layout = strategy.rank_layout()
    assert [g for g, _, _ in layout] == list(range(32))
    assert sorted({n for _, n, _ in layout}) == [0, 1, 2, 3] and sorted({lr for _, _, lr in layout}) == list(range(8))
    assert layout[13] == (13, 1, 5)


def test_auto_strategy_with_two_cpu_devices_is_ddp_with_gloo():
    trainer = Trainer(accelerator="cpu", devices=2)
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.strategy.process_group_backend == "gloo"


def test_a_strategy_instance_takes_the_trainer_devices():
    trainer = Trainer(strategy=DDPStrategy(timeout=30), accelerator="cpu", devices=2)
    assert trainer.strategy.world_size == 2 and trainer.strategy.process_group_backend == "gloo"
    assert trainer.strategy.timeout.total_seconds() == 30
    fixed = DDPStrategy(devices=[torch.device("cpu")] * 3)
    assert Trainer(strategy=fixed, accelerator="cpu", devices=2).strategy.world_size == 3


def test_backend_choices_are_checked():
    with pytest.raises(Exception, match="process_group_backend='nccl' needs CUDA devices"):
        DDPStrategy(devices=[torch.device("cpu")] * 2, process_group_backend="nccl")
    if not torch.distributed.is_mpi_available():
        with pytest.raises(Exception, match="needs a torch built with MPI"):
            DDPStrategy(process_group_backend="mpi")


class Unchanged(TrainModule):
    """Module-level (picklable for ddp_spawn) and unaware of the strategy."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _unchanged_fit(strategy: str, devices: int) -> tuple[dict[str, torch.Tensor], int]:
    seed_everything(0)
    model = Unchanged()
    trainer = Trainer(max_epochs=2, **{**QUIET, "devices": devices, "strategy": strategy})
    trainer.fit(model, DataLoader(regression_data(n=64), batch_size=32 // devices))
    return {k: v.clone() for k, v in model.state_dict().items()}, trainer.global_step


def _unchanged_rank(rank: int) -> tuple[dict[str, torch.Tensor], int]:
    return _unchanged_fit("ddp", 2)


@pytest.mark.distributed
def test_one_unchanged_module_runs_single_ddp_and_ddp_spawn():
    single, single_steps = _unchanged_fit("single", 1)
    (ddp, ddp_steps), _ = run_distributed(_unchanged_rank)
    spawn, spawn_steps = _unchanged_fit("ddp_spawn", 2)  # the launching process adopts rank 0's weights
    assert single_steps == ddp_steps == spawn_steps == 4
    for key in single:
        torch.testing.assert_close(ddp[key], single[key], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(spawn[key], single[key], rtol=1e-5, atol=1e-6)


class CountsGradientSyncs(BoringModel):
    """Registers a DDP comm hook that counts all-reduces, to see that accumulation skips them."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs_per_batch: list[int] = []
        self._count = 0

    def on_train_start(self) -> None:
        def hook(state, bucket):  # noqa: ANN001, ANN202 (DDP checks the annotations: leave them out)
            self._count += 1
            return allreduce_hook(None, bucket)

        self.trainer.strategy.model.register_comm_hook(None, hook)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.syncs_per_batch.append(self._count)
        self._count = 0


def _sync_count_rank(rank: int) -> list[int]:
    model = CountsGradientSyncs()
    Trainer(max_epochs=1, limit_train_batches=4, accumulate_grad_batches=2, limit_val_batches=0, **DDP).fit(model)
    return model.syncs_per_batch


@pytest.mark.distributed
def test_no_gradient_all_reduce_inside_an_accumulation_window():
    for syncs in run_distributed(_sync_count_rank):
        assert syncs[0] == syncs[2] == 0 and syncs[1] > 0 and syncs[3] > 0, syncs


@pytest.mark.distributed
def test_ddp_spawn_reports_the_log_folder_its_ranks_wrote(tmp_path):  # noqa: ANN001
    from pathlib import Path

    from trainer.loggers import CSVLogger

    (tmp_path / "csv_logs" / "version_0").mkdir(parents=True)  # an earlier run: the ranks pick version_1
    trainer = Trainer(max_epochs=1, log_every_n_steps=1,
                      **{**QUIET, "devices": 2, "strategy": "ddp_spawn", "logger": CSVLogger(tmp_path),
                         "enable_checkpointing": True})
    trainer.fit(Unchanged(), DataLoader(regression_data(n=16), batch_size=4))
    assert Path(trainer.log_dir).name == "version_1"
    assert [p.name for p in (Path(trainer.log_dir) / "checkpoints").iterdir()] == ["epoch=0-step=2.ckpt"]
    assert trainer.checkpoint_callback.best_model_path.endswith("version_1/checkpoints/epoch=0-step=2.ckpt")


def _max_time_rank(rank: int) -> int:
    """Rank 0's max_time clock starts 1 s after rank 1's, as when one rank is slower to reach fit()."""
    start = FitSchedule.start

    def late_start(self: FitSchedule, *args: Any) -> None:
        if rank == 0:
            time.sleep(1.0)
        start(self, *args)

    class SlowSteps(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(0.05)

    with mock.patch.object(FitSchedule, "start", late_start):  # this forked rank only
        trainer = Trainer(max_time={"seconds": 2}, limit_val_batches=0, callbacks=[SlowSteps()],
                          **{**DDP, "strategy": DDPStrategy(timeout=20)})
        trainer.fit(BoringModel())
    return trainer.global_step


@pytest.mark.distributed
def test_max_time_stops_every_rank_after_the_same_batch():
    """Each rank's own clock would stop rank 1 about 20 batches before rank 0, which then waits in a collective."""
    steps = run_distributed(_max_time_rank)
    assert steps[0] == steps[1] > 0
