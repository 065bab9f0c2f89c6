"""A fit's optimization set up once, before `on_fit_start`: `configure_optimizers()` read and checked, the
optimizers given to the strategy (which may swap in its own, ZeRO-1's), the schedulers' stepper, the wrappers the
module's `optimizers()` hands out, and whether the module clips its own way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.exceptions import ConfigError, MisconfigurationError
from trainer.core.module import TrainModule
from trainer.core.optimizer_setup import SchedulerStepper, normalize_optimizers
from trainer.hooks import MODULE, is_overridden, profiled_method, runs_hook
from trainer.loops import automatic_optimization as optimizer_path

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def setup_optimization(trainer: Trainer, model: Any) -> None:
    """Everything the fit loop needs from `configure_optimizers()`, checked as Lightning checks it."""
    loop, strategy, profiler = trainer.fit_state, trainer.strategy, trainer.profiler
    custom_scheduler_step = is_overridden(model, "lr_scheduler_step", TrainModule)
    configure = profiled_method(profiler, model, "configure_optimizers", MODULE)
    setup = normalize_optimizers(configure(), allow_none=not loop.automatic,
                                 custom_scheduler_step=custom_scheduler_step, automatic=loop.automatic)
    if loop.automatic and len(setup.optimizers) > 1:
        raise MisconfigurationError(
            f"configure_optimizers() returned {len(setup.optimizers)} optimizers; automatic optimization "
            "supports one. Set self.automatic_optimization = False and step them in training_step."
        )
    if not loop.automatic and trainer.accumulate_grad_batches > 1:
        raise ConfigError("accumulate_grad_batches > 1 is not supported with manual optimization; "
                          "accumulate in training_step instead.")
    optimizer_path.check_manual_optimization(loop, model, TrainModule)
    for optimizer in setup.optimizers:
        strategy.precision.check_optimizer(optimizer)
    loop.optimizers = strategy.setup_optimizers(setup.optimizers)
    for old, new in zip(setup.optimizers, loop.optimizers, strict=True):
        for config in setup.schedulers:  # a strategy may swap in its own optimizer (ZeRO-1)
            if getattr(config.scheduler, "optimizer", None) is old and new is not old:
                config.scheduler.optimizer = new
    loop.lr_scheduler_configs = setup.schedulers
    loop.scheduler_stepper = SchedulerStepper(setup.schedulers,
                                              profiled_method(profiler, model, "lr_scheduler_step", MODULE))
    loop.user_optimizers = optimizer_path.wrap_optimizers(loop, setup.optimizers)
    # Lightning calls configure_gradient_clipping at every step; without an override (or a profiler to time it)
    # the loop clips with the flags directly, which is the same
    loop.custom_clipping = runs_hook(model, "configure_gradient_clipping", TrainModule) or profiler.enabled
