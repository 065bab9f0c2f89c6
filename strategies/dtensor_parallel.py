"""What every strategy whose parameters are DTensors shares, whoever made them DTensors (FSDP2's `fully_shard` in
strategies/fsdp.py, or the user's `parallelize_module` and `fully_shard` under strategies/model_parallel.py): the
model built on the meta device and materialised shard by shard, FSDP2's gradient-sync switch, evaluation without
grad, and the checkpoint layout (full states in the standard layout, or every rank's shards in a DCP folder,
strategies/checkpoint_io/sharded/folder.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from strategies.base import NULL_CONTEXT
from strategies.checkpoint_io.sharded.async_save import AsyncSaver
from strategies.checkpoint_io.sharded.folder import load_into, load_sharded, save_sharded
from strategies.checkpoint_io.sharded.manifest import ShardedRef, is_folder_checkpoint
from strategies.exceptions import ConfigError
from strategies.model import dtensor
from strategies.model.meta_init import MetaInit
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision

DTENSOR_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")  # 16-mixed's GradScaler is untested on DTensors: refused


class DTensorParallelStrategy(ParallelStrategy):
    """A `ParallelStrategy` whose model holds DTensor parameters; subclasses decide how they become DTensors.

    Args:
        devices: this machine's devices, one process each; None takes the Trainer's.
        num_nodes: the number of machines.
        precision: the Precision object; 32-true, bf16-mixed and bf16-true are supported.
        sharded_checkpoint: every rank writes its own shards into a checkpoint folder instead of rank 0 writing
            one full file; `"async"` also writes them in the background while training goes on.
        activation_checkpointing: module classes whose forward is recomputed in backward (see Strategy).
        **parallel: `process_group_backend`, `timeout`, `min_timeout`, `timeout_steps`, `start_method`.

    Raises:
        ConfigError: an unsupported precision or `sharded_checkpoint` value, or ParallelStrategy's errors.
    """

    def __init__(self, devices: list[torch.device] | None = None, num_nodes: int = 1,
                 precision: Precision | None = None, *, sharded_checkpoint: bool | str = False,
                 activation_checkpointing: Sequence[type[nn.Module]] | None = None,
                 process_group_backend: str | None = None, timeout: timedelta | float | None = None,
                 start_method: str = "subprocess", min_timeout: timedelta | float | None = None,
                 timeout_steps: int | None = None) -> None:
        super().__init__(devices, num_nodes, precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method, min_timeout=min_timeout,
                         timeout_steps=timeout_steps, activation_checkpointing=activation_checkpointing)
        if sharded_checkpoint not in (True, False, "async"):
            raise ConfigError(f"{self._checkpoint_flag()}={sharded_checkpoint!r} is not valid: use False, True or "
                              "'async'.")
        self.sharded_checkpoint = sharded_checkpoint
        self._saver = AsyncSaver() if sharded_checkpoint == "async" else None
        self._in_run = False  # async saves only inside a run: its end waits for them
        self._meta_init = MetaInit()
        name = self.precision.name
        if name not in self.supported_precisions():
            raise ConfigError(f"precision={name!r} is not supported by {self._label()}; it supports: "
                              f"{', '.join(self.supported_precisions())}.")

    def _label(self) -> str:
        """How errors name this strategy."""
        return type(self).__name__

    def _checkpoint_flag(self) -> str:
        """The name under which the user passed `sharded_checkpoint`."""
        return "sharded_checkpoint"

    def supported_precisions(self) -> tuple[str, ...]:
        return DTENSOR_PRECISIONS

    @property
    def evaluation_shards_even(self) -> bool:
        """Forwards of sharded models are collectives: every rank joins every evaluation forward."""
        return True

    # --- building -----------------------------------------------------------------------------------
    def tensor_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        """Layers built in `trainer.init_module()` or `configure_model()` go on the meta device (unless
        `empty_init=False`) and are materialised shard by shard once they are DTensors
        (strategies/model/meta_init.py): the full model never exists on any rank, and the same seed gives the same
        weights at any world size and mesh shape."""
        if empty_init is False:
            return super().tensor_init_context(empty_init)
        stack = ExitStack()
        stack.enter_context(self._meta_init.capture(self.root_device, initialise=empty_init is None))
        stack.enter_context(self.precision.module_init_context())
        return stack

    def _to_device(self, module: nn.Module) -> nn.Module:
        # tensors still on 'meta' get storage after sharding, each rank only its shards
        return module._apply(lambda t: t if t.is_meta else t.to(self.root_device))

    # --- the step -----------------------------------------------------------------------------------
    def no_backward_sync(self, enabled: bool) -> AbstractContextManager:
        model = self.model
        if not enabled or not isinstance(model, dtensor.torch_sharding().FSDPModule):
            return NULL_CONTEXT  # no FSDP2 root: no gradient reduction to hold back
        return self._no_gradient_sync(model)

    @contextmanager
    def _no_gradient_sync(self, model: Any) -> Iterator[None]:
        model.set_requires_gradient_sync(False)  # recurses into every FSDP2 unit below the root
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def accumulated_gradients(self) -> dict[str, torch.Tensor] | None:
        return None  # FSDP2 keeps an unsynced window's gradients in its own unsharded buffers

    def evaluation_context(self, inference_mode: bool) -> AbstractContextManager:
        # FSDP2 gathers and frees parameters in hooks around forward, DTensor redistributes: no inference tensors
        # (Lightning evaluates sharded models in no_grad too)
        return torch.no_grad()

    # --- checkpoints --------------------------------------------------------------------------------
    def module_state_dict(self) -> dict[str, Any]:
        # full: collective, and with cpu_offload only rank 0 gets the tensors; sharded: each rank's own DTensors
        return dtensor.model_state(self.model, full=not self.sharded_checkpoint)

    def load_module_state_dict(self, state_dict: Any, strict: bool = True) -> None:
        if isinstance(state_dict, ShardedRef):
            target = dtensor.model_state(self.model, full=False)
            load_into(state_dict.folder, "model", target)
            dtensor.load_model_state(self.model, target, full=False, strict=strict)
            return
        dtensor.load_model_state(self.model, state_dict, full=True, strict=strict)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        return dtensor.optimizer_state(self.model, optimizer, full=not self.sharded_checkpoint)

    def load_optimizer_state_dict(self, optimizer: Optimizer, state_dict: Any) -> None:
        if isinstance(state_dict, ShardedRef):
            target = dtensor.optimizer_state(self.model, optimizer, full=False)
            load_into(state_dict.folder, state_dict.key, target)
            dtensor.load_optimizer_state(self.model, optimizer, target, full=False)
            return
        dtensor.load_optimizer_state(self.model, optimizer, state_dict, full=True)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        if self.sharded_checkpoint:
            saver = self._saver if self._in_run else None  # outside a run (after fit): synchronous
            save_sharded(self, checkpoint, path, saver, self.timeout)
        else:
            super().save_checkpoint(checkpoint, path)

    def remove_checkpoint(self, path: str | Path) -> None:
        if self._saver is None or not self._saver.defer(
                lambda: super(DTensorParallelStrategy, self).remove_checkpoint(path)):
            super().remove_checkpoint(path)

    def wait_for_saves(self) -> None:
        if self._saver is not None:
            self.raise_if_any_failed(self._saver.join())

    def setup_environment(self) -> None:
        super().setup_environment()
        self._in_run = True

    def teardown(self) -> None:
        """Failure path included: no rank leaves with a write in flight (local wait, no collective)."""
        self._in_run = False
        if self._saver is not None:
            error = self._saver.join()
            self._saver.forget_group()
            if error is not None:
                warnings.warn(f"the last asynchronous sharded save failed: {error}", stacklevel=2)
        super().teardown()

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        if is_folder_checkpoint(path):
            return load_sharded(self, path)
        return super().load_checkpoint(path)
