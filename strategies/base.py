"""The Strategy seam: everything that differs between single device, DP, DDP and ZeRO lives behind it.

The loop calls these methods unconditionally and never asks which strategy it has. Every method is called on every
rank unless its docstring says otherwise."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from strategies.checkpoint_io.atomic_file import atomic_save
from strategies.checkpoint_io.catalog import remove_checkpoint
from strategies.checkpoint_io.safe_load import safe_load
from strategies.comm import distributed
from strategies.exceptions import CheckpointSaveError
from strategies.model import compiled
from strategies.model.activation_checkpointing import apply_activation_checkpointing, checkpointed_classes
from strategies.model.device_move import module_on, move_to_device
from strategies.model.step_router import StepRouter
from strategies.model.wrapped_optimizer import unwrap_optimizer
from strategies.precision import CANONICAL_PRECISIONS, Precision

T = TypeVar("T")
ReduceOp = Literal["mean", "sum", "max", "min"]


NULL_CONTEXT = nullcontext()  # reusable; saves building one per step


class Strategy(ABC):
    """Owns device placement, wrapping, backward, optimizer stepping, collectives and checkpoint I/O.

    The Trainer calls these methods unconditionally and never asks which strategy it has, so swapping
    `strategy=` needs no change to the TrainModule. Every method is called on every rank unless its
    docstring says otherwise; the collectives and the checkpoint methods must be.

    Args:
        precision: the Precision object (autocast, loss scaling, casting); full fp32 when None.
        activation_checkpointing: module classes whose instances recompute their forward activations in backward
            instead of keeping them (torch's composable `checkpoint`), applied before the model is wrapped.
    """

    global_rank: int = 0
    local_rank: int = 0
    node_rank: int = 0
    world_size: int = 1

    def __init__(self, precision: Precision | None = None,
                 activation_checkpointing: Sequence[type[nn.Module]] | None = None) -> None:
        self.precision = precision if precision is not None else Precision()
        self.activation_checkpointing = checkpointed_classes(activation_checkpointing)
        self._module: nn.Module | None = None
        self._model: nn.Module | None = None
        self._step: Callable[..., Any] = self._not_set_up
        # Picked in setup_module: batch_to_device's device and whether the precision casts inputs; whether
        # unscale_gradients does anything (16-mixed's scaler, an override), else the loop skips it per step.
        self._batch_device: torch.device | None = None
        self._casts_input = self.unscales_gradients = True

    # --- registry -----------------------------------------------------------------------------
    @classmethod  # noqa: B027 (optional for user-defined strategies)
    def register(cls, registry: Any) -> None:
        """Add this class's names to the strategy registry (see strategies.registry)."""

    @classmethod
    def from_flags(
        cls, devices: list[torch.device], num_nodes: int, precision: Precision, **kwargs: Any
    ) -> Strategy:
        """Build the strategy from resolved Trainer flags (called by the registry)."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a strategy name; pass an instance.")

    def adopt_flags(self, devices: list[torch.device], num_nodes: int) -> None:  # noqa: B027 (optional)
        """A Strategy instance passed to the Trainer takes the Trainer's devices for what it left unset."""

    def supported_precisions(self) -> tuple[str, ...]:
        """Canonical precision names this strategy can run; checked by `validate_precision`."""
        return CANONICAL_PRECISIONS

    # --- topology -----------------------------------------------------------------------------
    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """The device this rank computes on."""

    @property
    def device_mesh(self) -> Any:
        """The device mesh the module's `configure_model` parallelizes over (`TrainModule.device_mesh`); None for a
        strategy that lays the model out itself."""
        return None

    @property
    def is_global_zero(self) -> bool:
        """True on global rank 0, the rank that writes logs and checkpoints."""
        return self.global_rank == 0

    # --- lifecycle ----------------------------------------------------------------------------
    def launch(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Run `fn` on every rank. Single process: just call it."""
        return fn(*args)

    def setup_environment(self) -> None:
        """Prepare this process (process group, device, rank-zero gating)."""
        distributed.rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]  # a function attribute

    def tensor_init_context(self, empty_init: bool | None = None) -> AbstractContextManager:
        """Where `trainer.init_module()` and `configure_model()` create tensors: on this rank's device, in the
        precision's dtype for *-true precisions; with `empty_init=True` the `torch.nn.init` calls are skipped
        (uninitialised values, for a model about to load a checkpoint). Sharding strategies build on 'meta'."""
        from contextlib import ExitStack

        from strategies.model.meta_init import EmptyInit

        stack = ExitStack()
        if empty_init:
            stack.enter_context(EmptyInit())
        stack.enter_context(torch.device(self.root_device))
        stack.enter_context(self.precision.module_init_context())
        return stack

    def setup_module(self, module: nn.Module) -> None:
        """Move the module to the device, apply precision, and build the wrapped step router."""
        module = self.precision.convert_module(self._to_device(module))
        apply_activation_checkpointing(module, self.activation_checkpointing)
        self._module = module
        precision = self.precision  # the base's forward_context is a no-op: the router enters none per step
        router = StepRouter(module, precision.forward_context
                            if type(precision).forward_context is not Precision.forward_context else None)
        self._model = self._wrap(router)
        # A wrapper (DDP, DP, FSDP2) does its work in __call__; with none, calling forward directly skips
        # nn.Module's hook machinery, which is pure overhead for our private router. FSDP2's fully_shard wraps
        # in place and works through forward hooks on the router (they gather the root unit's parameters), so
        # a router with hooks is always called.
        bare = self._model is router and not (router._forward_pre_hooks or router._forward_hooks)
        self._step = router.forward if bare else self._model
        self._batch_device, self._casts_input = self.root_device, type(precision).convert_input is not \
            Precision.convert_input
        self.unscales_gradients = type(self).unscale_gradients is not Strategy.unscale_gradients or precision.unscales()

    def _to_device(self, module: nn.Module) -> nn.Module:
        """Move the module to this rank's device before wrapping. A module already there is left alone: `to()`
        walks and re-assigns every tensor even then (about 0.3 ms of a small model's first step), unless the
        module overrides `to`, which is then always called."""
        device = self.root_device
        if type(module).to is nn.Module.to and module_on(module, device):
            return module
        return module.to(device)

    def _wrap(self, router: StepRouter) -> nn.Module:
        """Wrap the router (DDP, DP, FSDP2). Identity by default."""
        return router

    def compile_module(self, compiler: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """After `setup_module`: compile the user's forward (what `self(x)` runs) with the context of the
        `torch.compile` call the module came from, inside the wrapper (see strategies/model/compiled.py for why there).
        `teardown` takes it off again."""
        compiled.compile_forward(self.module, compiler)

    def evaluation_context(self, inference_mode: bool) -> AbstractContextManager:
        """The grad mode validation, test and predict run in: `torch.inference_mode()` when the Trainer's
        `inference_mode` flag asks for it, else `torch.no_grad()`."""
        return torch.inference_mode() if inference_mode else torch.no_grad()

    def sync_trainable_parameters(self) -> None:  # noqa: B027 (optional)
        """Called on every rank at each training epoch start, after its hooks (where fine-tuning unfreezes layers):
        adapt whatever the wrap built from the parameters that require grad. Nothing to do by default."""

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        """Return the optimizers to use (ZeRO-1 swaps in a sharded optimizer). Identity by default."""
        return optimizers

    def teardown(self) -> None:
        """Release what setup acquired. The wrapped model is kept (save_checkpoint after fit needs it); a compiled
        forward is taken off the user's module."""
        if self._module is not None:
            for module in self._module.modules():
                compiled.restore_forward(module)

    # --- hang bound and failures (no-ops on one process) ------------------------------------------------
    def bound_collectives(self, step_seconds: float | None) -> bool:
        """Training batches take `step_seconds` each (measured): bound how long a collective may wait for a rank that
        does not join (see strategies/comm/collective_timeout.py). None: outside training, the process group's own
        timeout. Called at agreements, not per step. Returns whether this strategy's bound follows the step time at
        all."""
        return False

    def diagnose_peer_failure(self, timed_out: bool) -> str | None:
        """After a collective failed because another rank died (`timed_out=False`) or did not join (True): a sentence
        naming that rank, or None. Runs on every rank that saw the failure; bounded in time."""
        return None

    def end_hung_peers(self) -> None:  # noqa: B027 (optional)
        """After the failure was reported: end the ranks `diagnose_peer_failure` found hung on this machine."""

    def describe_timeout(self) -> str:
        """How long a collective issued now may wait for a missing rank, and why (for error messages)."""
        return "the process group's timeout"

    # --- the step -----------------------------------------------------------------------------
    def step(self, method: str, *args: Any) -> Any:
        """Run `module.<method>(*args)` through the wrapper's forward."""
        return self._step(method, *args)

    @staticmethod
    def _not_set_up(*args: Any) -> Any:
        raise RuntimeError("Strategy.setup_module() must run before step().")

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the precision object (which scales the loss under 16-mixed), then through the module's
        own `backward(loss, *args, **kwargs)` hook where it has one (a TrainModule does; it may override it)."""
        self.precision.backward(loss, getattr(self._module, "backward", None), *args, **kwargs)

    def manual_step_context(self) -> AbstractContextManager:
        """Entered around training_step in manual optimization, where backward runs inside the wrapper's forward."""
        return NULL_CONTEXT

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward called by the user inside training_step (manual optimization); `args`/`kwargs` go to backward
        (e.g. retain_graph=True). A wrapper that prepares its gradient sync after forward returns (DDP) prepares it
        here instead."""
        self.backward(loss, *args, **kwargs)

    def no_backward_sync(self, enabled: bool) -> AbstractContextManager:
        """Skip gradient sync during accumulation (DDP no_sync). Must wrap forward and backward."""
        return NULL_CONTEXT

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling (16-mixed) so hooks and clipping read true gradients. Idempotent within a step."""
        self.precision.unscale_gradients(optimizer)

    def clip_gradients(
        self,
        optimizer: Optimizer,
        *,
        max_norm: float | None = None,
        max_value: float | None = None,
        norm_type: float = 2.0,
    ) -> Tensor | None:
        """Clip the optimizer's gradients by norm or value (unscaling first). No-op when both are None."""
        if max_norm is None and max_value is None:
            return None
        optimizer = unwrap_optimizer(optimizer)
        self.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if max_norm is not None:
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        if max_value is not None:
            torch.nn.utils.clip_grad_value_(params, max_value)
        return None

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> bool:
        """Step through the precision object; False means the step was skipped (AMP overflow, or no gradients).
        `kwargs` go to the optimizer's own `step`."""
        return self.precision.optimizer_step(optimizer, closure, **kwargs)

    # --- data ---------------------------------------------------------------------------------
    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any] | None:
        """Kwargs for a DistributedSampler (num_replicas, rank), or None when no sampler is injected."""
        return None

    @property
    def evaluation_shards_even(self) -> bool:
        """Whether every rank must run as many evaluation batches: true where the forward itself is a collective
        (FSDP2 gathers parameters), so a rank that ran out would leave the others waiting in it."""
        return False

    def batch_to_device(self, batch: Any, move: Callable[[Any, torch.device], Any] | None = None) -> Any:
        """Move the tensors of a (nested) batch to this rank's device, cast for `*-true` precisions.

        `move(batch, device)` replaces the default move (the module's `transfer_batch_to_device`).
        """
        device = self._batch_device or self.root_device
        moved = move_to_device(batch, device) if move is None else move(batch, device)
        return self.precision.convert_input(moved) if self._casts_input else moved

    # --- collectives (identities when world_size == 1) ------------------------------------------
    def all_reduce(self, tensor: Tensor, op: ReduceOp = "mean") -> Tensor:
        """Reduce `tensor` over all ranks with `op` ("mean", "sum", "max", "min"); identity on one process."""
        return distributed.all_reduce(tensor, op)

    def all_gather(self, tensor: Tensor) -> Tensor:
        """Every rank's `tensor`, stacked along a new first dimension indexed by rank."""
        return distributed.all_gather(tensor)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, indexed by rank (per-rank RNG and loop state in checkpoints)."""
        return distributed.all_gather_object(obj)

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Rank `src`'s picklable `obj`, on every rank."""
        return distributed.broadcast_object(obj, src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank gets here; `name` only labels the call."""
        distributed.barrier()

    def agree(self, values: list[int]) -> list[int]:
        """Element-wise MAX of small integer flags over all ranks, on a CPU-capable group (the control plane
        of trainer/ranks/agreement.py: it must not wait on the GPU stream). Identity with one process."""
        return distributed.all_reduce_max_ints(values)

    def start_agree(self, values: list[int]) -> distributed.Pending:
        """`agree` started without waiting: `.wait()` on the result gives the agreed flags (trainer/ranks/agreement.py
        overlaps it with the forward and backward). Already done with one process."""
        return distributed.start_all_reduce_max_ints(values)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a decision: all=True means every rank must say yes; all=False means any rank may."""
        if self.world_size == 1:
            return bool(decision)
        flag = torch.tensor(int(bool(decision)), device=self.root_device)
        total = int(self.all_reduce(flag, "sum").item())
        return total == self.world_size if all else total > 0

    def accumulated_gradients(self) -> dict[str, Tensor] | None:
        """This rank's gradient sum inside an open accumulation window, for checkpoints; None if it can't be read."""
        return {name: p.grad.detach().clone() for name, p in self.module.named_parameters() if p.grad is not None}

    # --- checkpoint (collective: call on every rank) ----------------------------------------------
    def module_state_dict(self) -> dict[str, Any]:
        """The module's state dict with the plain module's keys (may be empty on ranks other than 0)."""
        return self.module.state_dict()

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's full state dict, gathered from the shards where the strategy shards it."""
        return optimizer.state_dict()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        """Rank 0 writes one file atomically; every rank learns whether it worked and raises if not."""
        error = None
        if self.is_global_zero:
            try:
                atomic_save(checkpoint, path)
            except CheckpointSaveError as err:
                error = str(err)
        self.raise_if_any_failed(error)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete a checkpoint file or sharded folder (rank 0); a strategy that saves in the background deletes it
        once the save in flight has committed."""
        if self.is_global_zero:
            remove_checkpoint(path)

    def wait_for_saves(self) -> None:  # noqa: B027 (saves are synchronous by default)
        """Collective: return once this run's background saves have committed; raise CheckpointSaveError on every
        rank if one failed."""

    def raise_if_any_failed(self, error: str | None) -> None:
        """Collective: every rank raises CheckpointSaveError if any rank's part of a save failed. Called after the
        except block, never inside it: no collective runs in an exception handler."""
        errors = self.all_gather_object(error) if self.world_size > 1 else [error]
        by_message: dict[str, list[int]] = {}
        for rank, err in enumerate(errors):
            if err:
                by_message.setdefault(err, []).append(rank)
        if by_message:  # the same error on several ranks (DCP reports each rank's failure to all) is said once
            raise CheckpointSaveError("; ".join(
                f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {err}"
                for err, ranks in by_message.items()))

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Read a checkpoint with `torch.load(weights_only=True)`; damage becomes a `CheckpointLoadError`."""
        return safe_load(path, map_location="cpu")

    def load_module_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load a plain (unwrapped, unsharded) state dict into the module."""
        self.module.load_state_dict(state_dict, strict=strict)

    def load_optimizer_state_dict(self, optimizer: Optimizer, state_dict: dict[str, Any]) -> None:
        """Load a full optimizer state dict (as `optimizer_state_dict` returns it) into `optimizer`."""
        optimizer.load_state_dict(state_dict)

    # --- access -------------------------------------------------------------------------------
    @property
    def module(self) -> nn.Module:
        """The user's module, unwrapped: use for hooks, logging and state."""
        if self._module is None:
            raise RuntimeError("Strategy.setup_module() has not run yet.")
        return self._module

    @property
    def model(self) -> nn.Module:
        """The wrapped callable; use only through step()."""
        if self._model is None:
            raise RuntimeError("Strategy.setup_module() has not run yet.")
        return self._model

    @property
    def wrapped_module(self) -> nn.Module:
        """What `Trainer.model` shows: the wrapper (DDP, DataParallel) whose `forward` runs the steps, or the user's
        module itself when nothing wraps it (one device; ZeRO-2/3, which shard the module in place)."""
        model = self.model
        return self.module if isinstance(model, StepRouter) else model
