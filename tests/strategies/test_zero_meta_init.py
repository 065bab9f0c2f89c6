"""Meta-device initialisation under zero3: `trainer.init_module()` and `configure_model()` build the layers on
'meta', the strategy materialises them shard by shard after `fully_shard`. The same seed gives the same full
weights at any world size, and no rank ever holds the whole model (2 gloo CPU ranks, a memory cap)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo  # noqa: F401  (fully_shard imports it on first use, ~140 MiB: imported before the ranks fork)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.model.dtensor import full_tensor
from tests.helpers.boring import QUIET
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule
from trainer.exceptions import ConfigError

pytestmark = pytest.mark.timeout(240)


class Net(TrainModule):
    """Layers built in __init__ (under `trainer.init_module()`) and in `configure_model()`."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 9), nn.LayerNorm(9), nn.ReLU(), nn.Linear(9, 7))
        self.embed = nn.Embedding(5, 6)
        self.head: nn.Module | None = None

    def configure_model(self) -> None:
        if self.head is None:
            self.head = nn.Linear(7, 3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.head is not None
        return self.head(self.body(batch[0] + self.embed(torch.zeros(1, dtype=torch.long)))).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(16, 6, generator=torch.Generator().manual_seed(1))), batch_size=2)


def _fit(strategy: str, devices: int, empty_init: bool | None, steps: int) -> dict[str, torch.Tensor]:
    trainer = Trainer(max_steps=steps, **{**QUIET, "devices": devices, "strategy": strategy})
    torch.manual_seed(0)
    with trainer.init_module(empty_init=empty_init):
        model = Net()
    trainer.fit(model, _loader())
    return {k: full_tensor(v).detach().clone() for k, v in model.state_dict().items()}


def _rank(rank: int, empty_init: bool | None, steps: int) -> dict[str, torch.Tensor]:
    return _fit("zero3", 2, empty_init, steps)


def _one_rank(rank: int) -> dict[str, torch.Tensor]:
    return _fit("zero3", 1, None, 0)


def _plain_init() -> dict[str, torch.Tensor]:
    """A 1-process build on a real device (single-device strategy, no meta device): what the seed gives."""
    return _fit("single", 1, False, 0)


@pytest.mark.distributed
def test_meta_init_gives_the_plain_weights_at_any_world_size() -> None:
    reference = _plain_init()
    for state in run_distributed(_rank, None, 0, timeout=120):  # 2 ranks, gathered full state
        assert state.keys() == reference.keys()
        assert all(torch.equal(state[k], v) for k, v in reference.items())
    one_rank = run_distributed(_one_rank, world_size=1, timeout=120)[0]
    assert all(torch.equal(one_rank[k], v) for k, v in reference.items())


class WithNorm(Net):
    def __init__(self) -> None:
        super().__init__()
        self.body.append(nn.BatchNorm1d(7))


def _partly_meta(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    trainer = Trainer(max_steps=0, **{**QUIET, "devices": world_size, "strategy": "zero3" if rank >= 0 else "auto"})
    torch.manual_seed(0)
    model = WithNorm()  # built plainly; only configure_model's head goes on 'meta' under zero3
    model.body[-1].running_mean.fill_(0.5)  # a real buffer keeps its value through the materialisation
    trainer.fit(model, _loader())
    return {k: full_tensor(v).detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.distributed
def test_a_partly_meta_model_keeps_its_real_tensors() -> None:
    reference = _partly_meta(-1, 1)
    assert torch.equal(reference["body.4.running_mean"], torch.full((7,), 0.5))
    for state in run_distributed(_partly_meta, 2, timeout=120):
        assert all(torch.equal(state[k], v) for k, v in reference.items())


@pytest.mark.distributed
def test_meta_init_trains_like_a_plain_build() -> None:
    meta = run_distributed(_rank, None, 4, timeout=120)[0]
    plain = run_distributed(_rank, False, 4, timeout=120)[0]
    assert all(torch.equal(meta[k], plain[k]) for k in plain)
    assert not all(torch.equal(meta[k], v) for k, v in _plain_init().items())  # it did train


def test_layers_are_built_on_meta_and_the_rng_advances_as_in_a_plain_build() -> None:
    trainer = Trainer(**{**QUIET, "strategy": "zero3"})
    torch.manual_seed(0)
    with trainer.init_module():
        model = Net()
    assert all(p.is_meta for p in model.parameters())
    after_meta = torch.get_rng_state()
    torch.manual_seed(0)
    Net()
    assert torch.equal(after_meta, torch.get_rng_state())  # advanced as a plain build advances it


class NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))


class NoResetNet(Net):
    def configure_model(self) -> None:
        self.head = nn.Sequential(nn.Linear(7, 4), NoReset())


def _no_reset_rank(rank: int) -> str:
    trainer = Trainer(max_steps=1, **{**QUIET, "devices": 2, "strategy": "zero3"})
    try:
        trainer.fit(NoResetNet(), _loader())
    except ConfigError as err:
        return str(err)
    return "no error"


@pytest.mark.distributed
def test_a_meta_module_without_reset_parameters_is_refused_by_name() -> None:
    for message in run_distributed(_no_reset_rank, timeout=120):
        assert "NoReset was built on the meta device" in message and "reset_parameters()" in message


def test_init_module_elsewhere_builds_on_the_device_in_the_precision_dtype() -> None:
    trainer = Trainer(**{**QUIET, "precision": "bf16-true"})
    with trainer.init_module():
        layer = nn.Linear(3, 3)
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.device.type == "cpu"
    assert torch.get_default_dtype() == torch.float32
    before = torch.get_rng_state()
    with Trainer(**QUIET).init_module(empty_init=True):
        nn.Linear(3, 3)
    assert torch.equal(torch.get_rng_state(), before)  # no init ran


def test_init_module_matches_lightning() -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    built = {}
    for name, trainer in (("ours", Trainer(**{**QUIET, "precision": "bf16-true"})),
                          ("lightning", lightning.Trainer(accelerator="cpu", devices=1, precision="bf16-true",
                                                          logger=False, enable_progress_bar=False))):
        torch.manual_seed(0)
        with trainer.init_module():
            built[name] = nn.Linear(4, 2)
    ours, theirs = built["ours"], built["lightning"]
    assert ours.weight.dtype == theirs.weight.dtype and ours.weight.device == theirs.weight.device
    assert torch.equal(ours.weight, theirs.weight)


# --- no rank holds the whole model ---------------------------------------------------------------------
WIDTH, DEPTH = 2048, 32  # 32 x 2048 x 2048 fp32 = 512 MiB of frozen parameters, and a small trainable head


class Big(TrainModule):
    """A large frozen body (initialised by each Linear's reset_parameters) and a trainable head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(DEPTH)))
        self.body.requires_grad_(False)
        self.head = nn.Linear(WIDTH, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.head(self.body(batch[0])).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.head.parameters(), lr=0.1)


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def _capped_rank(rank: int) -> dict[str, float]:
    import ctypes

    # glibc raises its mmap threshold after freeing a large block, so later all-gather buffers come from the heap
    # and stay resident after they are freed: a fixed threshold makes RSS follow the live tensors
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the high-water mark restarts here
    start = _rss_kib("VmRSS:")
    trainer = Trainer(max_steps=2, **{**QUIET, "devices": 2, "strategy": "zero3"})
    with trainer.init_module():
        model = Big()
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(8, WIDTH)), batch_size=2))
    return {"peak_mib": (_rss_kib("VmHWM:") - start) / 1024, "steps": trainer.global_step}


@pytest.mark.distributed
def test_no_rank_ever_holds_the_whole_model() -> None:
    # The cap: the bytes of the full parameters (512 MiB), counted from process start, so it also covers the process
    # group, the Trainer, the shards and the step. A rank that built the whole model would exceed it: zero3 with
    # init_module(empty_init=False) peaked at 614 MiB here, with meta init 411 MiB (2026-11-25).
    cap = DEPTH * WIDTH * WIDTH * 4 / 2**20
    for result in run_distributed(_capped_rank, timeout=200):
        assert result["steps"] == 2
        assert result["peak_mib"] < cap, f"peak {result['peak_mib']:.0f} MiB >= cap {cap:.0f} MiB"
