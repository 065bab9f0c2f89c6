"""Lightning's DDP names and arguments: `strategy="ddp_find_unused_parameters_true"` (the string Lightning's
unused-parameter error tells users to pass) trains a module with an unused layer on 2 ranks; `DDPStrategy(
accelerator=..., parallel_devices=..., ddp_comm_hook=...)` is handled, and an argument DDP does not take is refused
when the strategy is built, not by a TypeError on every rank once the model is wrapped."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from strategies import DDPStrategy
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from trainer import Trainer

pytestmark = pytest.mark.timeout(120)
RUN = {**QUIET, "devices": 2, "max_steps": 2, "limit_val_batches": 0}


class UnusedLayer(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(32, 2)  # no gradient ever: plain DDP fails at the second step


def _unused_rank(rank: int, strategy: str) -> int:
    trainer = Trainer(strategy=strategy, **RUN)
    trainer.fit(UnusedLayer())
    return trainer.global_step


@pytest.mark.distributed
def test_the_find_unused_parameters_name_trains_a_module_with_an_unused_layer():
    assert run_distributed(_unused_rank, "ddp_find_unused_parameters_true") == [2, 2]


def _hooked_rank(rank: int) -> int:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = []

    def counting(hook: Any) -> Any:
        def wrapped(state, bucket):  # noqa: ANN001, ANN202 (DDP checks the annotations: leave them out)
            calls.append(1)
            return hook(state, bucket)
        return wrapped

    strategy = DDPStrategy(accelerator="cpu", ddp_comm_hook=allreduce_hook, ddp_comm_wrapper=counting)
    Trainer(strategy=strategy, **RUN).fit(BoringModel())
    return len(calls)


@pytest.mark.distributed
def test_a_comm_hook_and_its_wrapper_are_registered():
    assert all(count >= 2 for count in run_distributed(_hooked_rank))


def test_an_accelerator_that_is_not_the_runs_is_refused_before_any_rank_starts():
    with pytest.raises(ConfigError, match=r"DDPStrategy\(accelerator='cuda'\) but the run's devices are cpu"):
        Trainer(strategy=DDPStrategy(accelerator="gpu"), **{**RUN, "accelerator": "cpu"})
    strategy = DDPStrategy(accelerator="cpu")
    Trainer(strategy=strategy, **{**RUN, "accelerator": "cpu"})
    assert strategy.root_device.type == "cpu" and strategy.world_size == 2
    same = DDPStrategy(parallel_devices=[torch.device("cpu")] * 2)
    assert same.parallel_devices == [torch.device("cpu")] * 2


@pytest.mark.parametrize(("keyword", "message"), [("precision_plugin", "Trainer\\(precision=...\\)"),
                                                  ("cluster_environment", "detected from the environment"),
                                                  ("bucket_size", "unknown keyword")])
def test_arguments_ddp_would_refuse_on_every_rank_are_refused_at_construction(keyword: str, message: str):
    with pytest.raises(ConfigError, match=message):
        DDPStrategy(**{keyword: object()})
