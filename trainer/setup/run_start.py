"""What a run does with the user's objects before its first batch, in Lightning's order: merge the callbacks the
module returns from `configure_callbacks`, refuse Lightning hooks that would not be called, run `prepare_data`
once per machine (the other ranks wait), call `configure_model`, and read the step signatures and batch-transfer
hooks once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from strategies.comm.distributed import rank_zero_info
from strategies.exceptions import MisconfigurationError
from trainer.core.module import TrainModule
from trainer.hooks import DATAMODULE, MODULE, is_overridden, profiled_method
from trainer.ranks.step_returns import training_step_may_skip
from trainer.setup.defaults import check_state_keys, order_callbacks
from trainer.setup.step_signature import steps_without_batch_idx
from trainer.setup.uncalled_hooks import refuse_uncalled_hooks
from trainer.state import TrainerFn

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState
    from trainer.trainer import Trainer


def merge_model_callbacks(given: list[Any], returned: Any) -> list[Any]:
    """`given` with the callbacks from `configure_callbacks()`: one whose type is (a subclass of) a given callback's
    type replaces every given callback of that type; then Lightning's order (trainer/setup/defaults.py: the tuner's
    callbacks first, the checkpoint callbacks last)."""
    if not returned:
        return given
    from callbacks.base import Callback

    model_callbacks = list(returned) if isinstance(returned, Sequence) else [returned]
    for cb in model_callbacks:
        if not isinstance(cb, Callback):
            raise MisconfigurationError(
                f"configure_callbacks() returned {cb!r}, which is not a callbacks.Callback instance."
            )
    given_types = {type(cb) for cb in given} - {Callback}
    replaced = {kind for kind in given_types if any(issubclass(type(cb), kind) for cb in model_callbacks)}
    if replaced:
        rank_zero_info("The following callbacks returned in `configure_callbacks` will override existing callbacks "
                       f"passed to Trainer: {', '.join(sorted(kind.__name__ for kind in replaced))}")
    merged = [cb for cb in given if type(cb) not in replaced] + model_callbacks
    check_state_keys(merged)
    return order_callbacks(merged)


def before_environment(trainer: Trainer, module: Any) -> None:
    """Before any process group exists: the module's callbacks join, then the uncalled-hook check."""
    configure = profiled_method(trainer.profiler, module, "configure_callbacks", MODULE)
    trainer.callbacks = merge_model_callbacks(trainer.callbacks, configure())
    for callback in trainer.callbacks:
        attach_logging(callback, module)
    trainer.fit_state.hooks.reset()
    refuse_uncalled_hooks(module, trainer.datamodule, trainer.callbacks)


def attach_logging(callback: Any, module: Any) -> None:
    """`self.log` / `self.log_dict` in a callback's hooks are the running module's, as Lightning attaches them to each
    callback instance; a callback class that defines its own `log` or `log_dict` keeps it."""
    for name in ("log", "log_dict"):
        if getattr(type(callback), name, None) is None:
            setattr(callback, name, getattr(module, name))


def prepare_data(trainer: Trainer, module: Any) -> None:
    """The DataModule's, then the module's `prepare_data`, each where Lightning runs it: on local rank 0 of every
    machine (`prepare_data_per_node=True`, the default) or on global rank 0 only; every rank waits for it."""
    from trainer.core.datamodule import DataModule
    from trainer.core.module import TrainModule

    local_zero = trainer.local_rank == 0
    global_zero = local_zero and trainer.node_rank == 0
    for obj, base, tag in ((trainer.datamodule, DataModule, DATAMODULE), (module, TrainModule, MODULE)):
        if obj is None or not is_overridden(obj, "prepare_data", base):
            continue
        if local_zero if obj.prepare_data_per_node else global_zero:
            profiled_method(trainer.profiler, obj, "prepare_data", tag)()
        trainer.strategy.barrier("prepare_data")


def configure_model(strategy: Any, module: Any, profiler: Any) -> None:
    """`configure_model()` after `setup`, before the strategy sets the module up (when the user defined it), inside
    the strategy's `tensor_init_context()`: layers it creates are built on the device in the precision's dtype, or
    on the meta device under a sharding strategy (materialised shard by shard when the strategy wraps the module)."""
    from trainer.core.module import TrainModule

    if is_overridden(module, "configure_model", TrainModule):
        with strategy.tensor_init_context():
            profiled_method(profiler, module, "configure_model", MODULE)()




def sync_batchnorm(trainer: Trainer, module: Any) -> None:
    """`Trainer(sync_batchnorm=True)` with several processes: BatchNorm layers become SyncBatchNorm before the
    strategy wraps the module, so their statistics cover the global batch (flags.py refuses it off CUDA)."""
    if trainer.fit_state.spec.sync_batchnorm and trainer.world_size > 1:
        import torch

        torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)


def read_signatures(loop: FitState, module: Any, fn: TrainerFn) -> None:
    """Once per run: which steps take `batch_idx`, whether training_step can return None (the agreement's shape,
    trainer/ranks/agreement.py), and the batch-transfer hooks. Whether the evaluation steps take `dataloader_idx` is
    checked when their loaders are known (trainer/loops/evaluation_loop.py)."""
    loop.no_batch_idx = steps_without_batch_idx(module)
    # One process agrees with nobody: the source of training_step (0.4 ms to read) is needed with several only.
    loop.control.step_may_skip = training_step_may_skip(module) if loop.strategy.world_size > 1 else True
    loop.transfer.resolve(module, loop.trainer.datamodule, loop.trainer.profiler)


def check_model(fn: TrainerFn, model: Any, compiled: bool) -> None:
    """A TrainModule defining the steps `fn` needs (training_step and configure_optimizers to fit)."""
    if not isinstance(model, TrainModule):
        inside = " inside torch.compile" if compiled else ""
        raise MisconfigurationError(
            f"{fn.value}() needs a TrainModule, got {type(model).__name__}{inside}. Subclass trainer.TrainModule."
        )
    if fn == TrainerFn.FITTING:
        if not is_overridden(model, "training_step", TrainModule):
            raise MisconfigurationError(f"{type(model).__name__} must define training_step(batch, batch_idx) to fit.")
        if not is_overridden(model, "configure_optimizers", TrainModule):
            raise MisconfigurationError(f"{type(model).__name__} must define configure_optimizers() to fit.")
    required = {TrainerFn.VALIDATING: "validation_step", TrainerFn.TESTING: "test_step"}.get(fn)
    if required and not is_overridden(model, required, TrainModule):
        raise MisconfigurationError(
            f"{type(model).__name__} must define {required}(batch, batch_idx) for {fn.value}()."
        )
