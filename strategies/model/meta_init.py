"""Building a model without memory: layers created on the meta device, initialised later one module at a time.

`trainer.init_module()` and `configure_model()` under a parameter-sharding strategy (zero2/zero3) create the
layers on the meta device, so no rank ever holds the whole model. The strategy shards them (`fully_shard`), gives
the local shards storage (`to_empty`), then replays the initialisation here: module by module, in the order the
modules were built, each module's `reset_parameters()` runs on full-size temporaries of that module alone, from
the RNG state the build started with, and each rank keeps its own slice. So the full weights are the ones a plain
build with the same seed gives, at any world size; a rank holds its shards plus one module's tensors in full.

`EmptyInit` is the other half of Lightning's `init_module(empty_init=True)`: on strategies that build the model
in full it skips the `torch.nn.init` calls (the values are about to be loaded from a checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from strategies.exceptions import ConfigError


class EmptyInit(TorchFunctionMode):
    """Inside it, `torch.nn.init.*` functions return their tensor untouched (uninitialised memory)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else (kwargs or {}).get("tensor")
        return func(*args, **(kwargs or {}))


@dataclass
class _Build:
    """One meta-device build: the RNG state it started from, and its modules in construction order."""

    rng_state: Tensor
    initialise: bool
    modules: list[nn.Module] = field(default_factory=list)


def _own_tensors(module: nn.Module) -> list[tuple[str, Tensor, bool]]:
    """(name, tensor, is_parameter) for the tensors the module registers itself (not its children's)."""
    params = [(n, t, True) for n, t in module.named_parameters(recurse=False)]
    return params + [(n, t, False) for n, t in module.named_buffers(recurse=False)]


class MetaInit:
    """Records the modules built on the meta device, then materialises them after sharding (see the module doc).

    State lives on the strategy instance that owns it; `materialize` clears it.
    """

    def __init__(self) -> None:
        self._builds: list[_Build] = []

    @contextmanager
    def capture(self, device: torch.device, initialise: bool = True) -> Iterator[None]:
        """Build on the meta device, recording each module that registers a meta tensor, in construction order.
        `device` is where a plain build would have drawn its random numbers (the rank's device).
        `initialise=False` (`empty_init=True`): the tensors are left uninitialised (a checkpoint will fill them)."""
        from torch.nn.modules.module import (
            register_module_buffer_registration_hook,
            register_module_parameter_registration_hook,
        )

        build = _Build(_rng_state(device), initialise)
        seen: set[int] = set()

        def record(module: nn.Module, name: str, tensor: Tensor | None) -> None:
            if tensor is not None and tensor.is_meta and id(module) not in seen:
                seen.add(id(module))
                build.modules.append(module)

        hooks = [register_module_parameter_registration_hook(record), register_module_buffer_registration_hook(record)]
        try:
            with torch.device("meta"):
                yield
        finally:
            for hook in hooks:
                hook.remove()
            self._builds.append(build)
        if initialise:  # leave the RNG where a plain build leaves it, so what follows draws the same numbers
            with torch.no_grad():
                for module in build.modules:
                    _initialise(module, device, keep=False)

    def materialize(self, root: nn.Module, device: torch.device, param_device: torch.device | None = None) -> None:
        """Give every meta tensor under `root` storage on `device` and its initial values (after sharding: each
        DTensor receives its local slice); `param_device`: where the parameter shards live instead (the host,
        under CPU offload). The global RNG is left as it is: the build advanced it already."""
        if not any(t.is_meta for t in _all_tensors(root)):
            self._builds.clear()
            return
        _to_empty_keeping_values(root, param_device or device, device)
        builds, self._builds = self._builds, []
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []), torch.no_grad():
            for build in builds:
                _set_rng_state(device, build.rng_state)
                for module in build.modules:
                    if build.initialise:
                        _initialise(module, device)
        for name, tensor in _named_tensors(root):
            if tensor.is_meta:
                raise ConfigError(f"{name} is still on the meta device after set-up: it was created on 'meta' "
                                  "outside trainer.init_module() / configure_model(); create it there, or on a "
                                  "real device.")


def _rng_state(device: torch.device) -> Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def _all_tensors(root: nn.Module) -> Iterator[Tensor]:
    yield from root.parameters()
    yield from root.buffers()


def _named_tensors(root: nn.Module) -> Iterator[tuple[str, Tensor]]:
    yield from root.named_parameters()
    yield from root.named_buffers()


def _to_empty_keeping_values(root: nn.Module, param_device: torch.device, buffer_device: torch.device) -> None:
    """`root.to_empty(device)` (FSDP2's way to give sharded meta parameters storage), keeping the values of the
    tensors that were real already (a model built partly outside the meta context); buffers on `buffer_device`."""
    from strategies.model.dtensor import local_slice

    real = [(module, name, local_slice(t).detach().clone()) for module in root.modules()
            for name, t, _ in _own_tensors(module) if not t.is_meta]
    root.to_empty(device=param_device)  # may replace the tensor objects: look them up again below
    if buffer_device != param_device:
        for module in root.modules():
            for name, buffer in module.named_buffers(recurse=False):
                module._buffers[name] = buffer.to(buffer_device)
    with torch.no_grad():
        for module, name, value in real:
            local_slice(getattr(module, name)).copy_(value)


def _initialise(module: nn.Module, device: torch.device, keep: bool = True) -> None:
    """Run `module.reset_parameters()` on full-size temporaries of its own tensors and copy each rank's slice
    into the (sharded) originals (`keep=False`: only draw the random numbers). Consumes the RNG as the module's
    plain construction did."""
    from strategies.model.dtensor import local_slice

    own = _own_tensors(module)
    if not own:
        return
    reset = getattr(module, "reset_parameters", None)
    if not callable(reset):
        raise ConfigError(f"{type(module).__name__} was built on the meta device (trainer.init_module() or "
                          "configure_model() under a sharding strategy) but has no reset_parameters() to initialise "
                          f"its tensors {[n for n, _, _ in own]}. Define reset_parameters(), or build it with "
                          "trainer.init_module(empty_init=False).")
    temporaries: dict[str, Tensor] = {}
    for name, tensor, is_param in own:
        temp = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
        temporaries[name] = nn.Parameter(temp, requires_grad=tensor.requires_grad) if is_param else temp
    _swap(module, own, temporaries)
    try:
        reset()
    finally:
        values = {name: t for name, t, _ in _own_tensors(module)}
        _swap(module, own, {name: tensor for name, tensor, _ in own})
    if not keep:
        return
    for name, tensor, _ in own:
        local_slice(tensor).copy_(local_slice(tensor, values[name].detach()))


def _swap(module: nn.Module, own: list[tuple[str, Tensor, bool]], tensors: dict[str, Tensor]) -> None:
    """Put `tensors` in place of the module's own ones without registration hooks or sharding bookkeeping."""
    for name, _, is_param in own:
        if is_param:
            module._parameters[name] = tensors[name]  # type: ignore[assignment]  # a Parameter, as registered
        else:
            module._buffers[name] = tensors[name]
