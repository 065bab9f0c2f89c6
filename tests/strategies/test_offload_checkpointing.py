"""CPU offload for zero2/zero3 (FSDP2's CPUOffloadPolicy) and activation checkpointing by module class on every
strategy, on gloo CPU ranks. On a CPU machine offload cannot save device memory (the device is the host): what is
checked is that the policy is applied and that parameters, gradients and optimizer state live where it says."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback
from strategies import DDPStrategy, SingleDeviceStrategy, ZeroStrategy
from strategies.model.dtensor import full_tensor
from strategies.registry import STRATEGY_REGISTRY
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything
from trainer.exceptions import ConfigError

pytestmark = pytest.mark.timeout(180)


class Block(nn.Module):
    calls = 0  # forward calls, all instances

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc, self.norm = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Block.calls += 1
        return x + torch.tanh(self.norm(self.fc(x)))


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 16)
        self.blocks = nn.Sequential(Block(16), Block(16))
        self.out = nn.Linear(16, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.out(self.blocks(self.inp(x))), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class Placement(Callback):
    """Host-side accounting: the device of every parameter shard, gradient and optimizer-state tensor."""

    def __init__(self) -> None:
        self.devices: dict[str, set[str]] = {"params": set(), "grads": set(), "optimizer_state": set()}
        self.offload_flags: set[bool] = set()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        for p in pl_module.parameters():
            self.devices["params"].add(_local(p).device.type)
            if p.grad is not None:
                self.devices["grads"].add(_local(p.grad).device.type)
        for module in pl_module.modules():
            state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
            group = state._fsdp_param_group if state is not None else None
            if group is not None:  # torch's own record of the policy each unit was sharded with
                self.offload_flags.update(fp.offload_to_cpu for fp in group.fsdp_params)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        for state in trainer.optimizers[0].state.values():
            self.devices["optimizer_state"].update(_local(v).device.type for v in state.values()
                                                   if isinstance(v, torch.Tensor))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _fit(strategy: Any, devices: int, steps: int = 6, callbacks: list | None = None) -> tuple[dict, int, Trainer]:
    seed_everything(0)
    Block.calls = 0
    model = Net()
    trainer = Trainer(max_steps=steps, callbacks=callbacks, **{**QUIET, "devices": devices, "strategy": strategy})
    trainer.fit(model, DataLoader(regression_data(n=96), batch_size=4))
    state = {k: full_tensor(v).detach().clone() for k, v in model.state_dict().items()}
    return state, Block.calls, trainer


# --- offload ----------------------------------------------------------------------------------------------
def _offload_rank(rank: int, name: str) -> dict[str, Any]:
    probe = Placement()
    state, _, trainer = _fit(name, 2, callbacks=[probe])
    return {"state": state, "devices": probe.devices, "offload": probe.offload_flags, "repr": repr(trainer.strategy)}


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_offload_keeps_the_states_on_the_host_and_trains_like_no_offload(stage: int) -> None:
    offloaded = run_distributed(_offload_rank, f"zero{stage}_offload", timeout=150)
    plain = run_distributed(_offload_rank, f"zero{stage}", timeout=150)
    for rank in range(2):
        assert offloaded[rank]["offload"] == {True} and plain[rank]["offload"] == {False}
        assert offloaded[rank]["devices"] == {"params": {"cpu"}, "grads": {"cpu"}, "optimizer_state": {"cpu"}}
        assert "offload=True" in offloaded[rank]["repr"]
        for key, value in plain[rank]["state"].items():
            torch.testing.assert_close(offloaded[rank]["state"][key], value)


def test_offload_names_and_refusals() -> None:
    assert {"zero2_offload", "zero3_offload"} <= set(STRATEGY_REGISTRY.names())
    assert ZeroStrategy(stage=3, offload=True).offload
    with pytest.raises(ConfigError, match="offload=True.*stage 2 or 3"):
        ZeroStrategy(stage=1, offload=True)


# --- activation checkpointing -----------------------------------------------------------------------------
def _checkpointing_rank(rank: int, stage: str, classes: list) -> tuple[dict, int]:
    strategy = ZeroStrategy(stage=int(stage[-1]), activation_checkpointing=classes) if stage.startswith("zero") \
        else DDPStrategy(activation_checkpointing=classes)
    state, calls, _ = _fit(strategy, 2)
    return state, calls


def _assert_recomputed(checkpointed: tuple[dict, int], plain: tuple[dict, int], steps: int = 6) -> None:
    assert plain[1] == 2 * steps  # two blocks, one forward each per step
    assert checkpointed[1] == 2 * 2 * steps  # and once more in every backward
    for key, value in plain[0].items():
        torch.testing.assert_close(checkpointed[0][key], value)


def test_activation_checkpointing_single_device() -> None:
    checkpointed, calls, trainer = _fit(SingleDeviceStrategy("cpu", activation_checkpointing=[Block]), 1)
    _assert_recomputed((checkpointed, calls), _fit(SingleDeviceStrategy("cpu"), 1)[:2])
    again = Trainer(max_steps=2, **{**QUIET, "strategy": SingleDeviceStrategy("cpu", activation_checkpointing=[Block])})
    again.fit(trainer.lightning_module, DataLoader(regression_data(n=16), batch_size=4))  # set up a second time
    assert again.global_step == 2


@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["ddp", "zero1", "zero2", "zero3"])
def test_activation_checkpointing_on_two_ranks(stage: str) -> None:
    checkpointed = run_distributed(_checkpointing_rank, stage, [Block], timeout=150)
    plain = run_distributed(_checkpointing_rank, stage, [], timeout=150)
    for rank in range(2):
        _assert_recomputed(checkpointed[rank], plain[rank])


def test_activation_checkpointing_keeps_the_state_dict_keys_and_refuses_non_modules() -> None:
    strategy = SingleDeviceStrategy("cpu", activation_checkpointing=[Block])
    model = Net()
    keys = list(model.state_dict())
    strategy.setup_module(model)
    assert list(model.state_dict()) == keys
    with pytest.raises(ConfigError, match="nn.Module subclasses"):
        DDPStrategy(activation_checkpointing=["Block"])  # type: ignore[list-item]
