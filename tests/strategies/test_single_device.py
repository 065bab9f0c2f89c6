"""The strategy seam with its single-device implementation: routing, device moves, registry, flags."""

from __future__ import annotations

import contextlib
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from strategies import STRATEGY_REGISTRY, Precision, SingleDeviceStrategy, Strategy
from strategies.base import move_to_device
from strategies.exceptions import ConfigError
from strategies.launch.devices import resolve_devices
from strategies.model.device_move import module_on
from strategies.model.step_router import StepRouter
from strategies.precision import canonical_precision, precision_from_flag
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer


def test_steps_go_through_the_routers_forward(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    original = StepRouter.forward

    def recording(self: StepRouter, method: str, *args: Any) -> Any:
        calls.append(method)
        return original(self, method, *args)

    monkeypatch.setattr(StepRouter, "forward", recording)
    strategy = SingleDeviceStrategy("cpu")
    module = BoringModel()
    strategy.setup_module(module)
    assert isinstance(strategy.model, StepRouter) and strategy.module is module
    strategy.step("training_step", torch.randn(4, 32), 0)
    strategy.step("predict_step", torch.randn(4, 32), 0)
    assert calls == ["training_step", "predict_step"]


def test_a_wrapping_strategy_calls_the_wrapper_so_its_hooks_run():
    calls: list[str] = []

    class Wrapped(SingleDeviceStrategy):
        def _wrap(self, router: StepRouter) -> nn.Module:
            wrapper = nn.Sequential()  # stands in for DDP: anything whose __call__ must run
            wrapper.forward = router.forward  # type: ignore[method-assign]
            wrapper.register_forward_pre_hook(lambda mod, args: calls.append(args[0]))
            return wrapper

    strategy = Wrapped("cpu")
    strategy.setup_module(BoringModel())
    strategy.step("training_step", torch.randn(4, 32), 0)
    assert calls == ["training_step"]


def test_trainer_uses_the_router_for_every_step():
    calls: list[str] = []

    class Spy(SingleDeviceStrategy):
        def step(self, method: str, *args: Any) -> Any:
            calls.append(method)
            return super().step(method, *args)

    trainer = Trainer(strategy=Spy("cpu"), max_epochs=1, limit_train_batches=2, limit_val_batches=1,
                      num_sanity_val_steps=0, **{k: v for k, v in QUIET.items() if k not in ("devices",)})
    trainer.fit(BoringModel())
    assert calls == ["training_step", "training_step", "validation_step"]


def test_move_to_device_handles_nested_containers():
    Point = namedtuple("Point", "x y")
    batch = {"a": [torch.ones(1), (torch.zeros(1), "text")], "p": Point(torch.ones(1), 3)}
    moved = move_to_device(batch, torch.device("cpu"))
    assert moved["a"][1][1] == "text" and isinstance(moved["p"], Point) and moved["p"].y == 3
    assert torch.equal(moved["a"][0], torch.ones(1))


def test_collectives_are_identities_on_one_process():
    s = SingleDeviceStrategy("cpu")
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(s.all_reduce(t, "sum"), t) and s.all_gather(t).shape == (1, 2)
    assert s.broadcast({"x": 1}) == {"x": 1}
    assert s.reduce_boolean_decision(True) and not s.reduce_boolean_decision(False, all=False)
    s.barrier()


def test_registry_and_auto_resolution():
    assert "single" in STRATEGY_REGISTRY.names()
    trainer = Trainer(accelerator="cpu", devices=1)
    assert isinstance(trainer.strategy, SingleDeviceStrategy) and trainer.strategy.root_device.type == "cpu"


def test_custom_strategy_must_say_what_it_lacks():
    class Incomplete(Strategy):
        @property
        def root_device(self) -> torch.device:
            return torch.device("cpu")

    with pytest.raises(NotImplementedError, match="pass an instance"):
        Incomplete.from_flags(devices=[torch.device("cpu")], num_nodes=1, precision=Precision())


@pytest.mark.parametrize(("flag", "name"), [(32, "32-true"), ("32", "32-true"), ("16", "16-mixed"),
                                            ("bf16", "bf16-mixed"), (64, "64-true"), ("BF16-TRUE", "bf16-true")])
def test_precision_alias_table(flag: Any, name: str):
    assert canonical_precision(flag) == name


@pytest.mark.parametrize("name", ["32-true", "64-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"])
def test_single_device_strategy_accepts_every_precision(name: str):
    trainer = Trainer(precision=name, **QUIET)
    assert repr(trainer.strategy.precision) == repr(precision_from_flag(name, "cpu"))


@pytest.mark.parametrize(("devices", "count"), [(1, 1), ("1", 1), ("auto", 1), ([0], 1)])
def test_devices_parsing_on_cpu(devices: Any, count: int):
    assert len(resolve_devices("cpu", devices)) == count


@pytest.mark.parametrize("devices", [0, -1, "x", True, [], [-1]])
def test_bad_devices(devices: Any):
    with pytest.raises(ConfigError, match="devices="):
        resolve_devices("cpu", devices)


def test_module_moves_to_the_strategy_device():
    strategy = SingleDeviceStrategy("cpu")
    module = nn.Linear(2, 2)
    strategy.setup_module(module)
    assert next(strategy.module.parameters()).device.type == "cpu"


def test_a_module_already_on_the_device_is_not_walked_by_to(monkeypatch: pytest.MonkeyPatch):
    moved: list[nn.Module] = []
    original = nn.Module.to

    def counting(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        moved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "to", counting)
    module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    SingleDeviceStrategy("cpu").setup_module(module)
    assert moved == []


def test_a_module_that_overrides_to_is_always_moved_through_it():
    class Tracking(nn.Linear):
        def to(self, *args: Any, **kwargs: Any) -> nn.Module:
            self.moved_to = args
            return super().to(*args, **kwargs)

    module = Tracking(2, 2)
    SingleDeviceStrategy("cpu").setup_module(module)
    assert module.moved_to == (torch.device("cpu"),)


def test_module_on_looks_at_parameters_and_buffers():
    module = nn.BatchNorm1d(2)
    assert module_on(module, torch.device("cpu"))
    module.register_buffer("elsewhere", torch.empty(1, device="meta"))
    assert not module_on(module, torch.device("cpu"))
    assert not module_on(nn.Linear(2, 2, device="meta"), torch.device("cpu"))


def test_a_module_with_its_own_apply_is_always_moved():
    class OwnApply(nn.Linear):
        applied = 0

        def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> nn.Module:
            type(self).applied += 1
            return super()._apply(fn, *args, **kwargs)

    module = nn.Sequential(nn.Linear(2, 2), OwnApply(2, 2))
    assert not module_on(module, torch.device("cpu"))
    SingleDeviceStrategy("cpu").setup_module(module)
    assert OwnApply.applied == 1


class _CountingInputs(Precision):
    """A user's precision that does something with every batch (the base class's convert_input is an identity)."""

    def __init__(self) -> None:
        self.batches = 0

    def convert_input(self, batch: Any) -> Any:
        self.batches += 1
        return batch


def test_a_precision_that_converts_inputs_sees_every_training_batch():
    """batch_to_device skips the identity convert_input of the base class, never a precision's own."""
    precision = _CountingInputs()
    trainer = Trainer(strategy=SingleDeviceStrategy("cpu", precision=precision), max_steps=3,
                      **{**QUIET, "limit_val_batches": 0})
    trainer.fit(BoringModel())
    assert precision.batches == 3


class _CountingContext(Precision):
    """A user's precision with a context of its own around every step (the base class's is a shared no-op)."""

    def __init__(self) -> None:
        self.entered = 0

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        self.entered += 1
        yield

    def forward_context(self) -> contextlib.AbstractContextManager:
        return self._counted()


def test_a_precision_with_a_forward_context_is_entered_around_every_step():
    """The router enters no context for the base class's no-op, and always a precision's own."""
    precision = _CountingContext()
    strategy = SingleDeviceStrategy("cpu", precision=precision)
    strategy.setup_module(BoringModel())
    strategy.step("training_step", torch.randn(4, 32), 0)
    strategy.step("training_step", torch.randn(4, 32), 1)
    assert precision.entered == 2
