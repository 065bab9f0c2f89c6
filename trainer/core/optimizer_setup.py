"""`configure_optimizers()` → OptimizerSetup, and scheduler stepping (interval, frequency, monitor)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim import Optimizer

from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import MisconfigurationError

_ACCEPTED = (
    "an Optimizer; a list of Optimizers; a tuple (list of Optimizers, list of schedulers); "
    "a dict {'optimizer': opt, 'lr_scheduler': sched or {'scheduler': sched, 'interval': 'epoch'|'step', "
    "'frequency': 1, 'monitor': 'val_loss'}}; or a list of such dicts"
)
_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau"}
_STEPPING_KEYS = {"interval", "frequency", "monitor", "strict", "reduce_on_plateau"}
_TORCH_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


@dataclass
class SchedulerConfig:
    """One LR scheduler and when to step it."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None
    reduce_on_plateau: bool | None = None  # steps with the monitored metric; None: when it is a ReduceLROnPlateau

    @property
    def needs_metric(self) -> bool:
        if self.reduce_on_plateau is not None:
            return bool(self.reduce_on_plateau)
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class NoOptimizer(Optimizer):
    """What automatic optimization steps when configure_optimizers() returned None: its step only runs the closure
    (training_step and backward), so the loop, its hooks and logging run as usual and no weight changes."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


@dataclass
class OptimizerSetup:
    optimizers: list[Optimizer] = field(default_factory=list)
    schedulers: list[SchedulerConfig] = field(default_factory=list)


def _bad(result: Any, why: str) -> MisconfigurationError:
    return MisconfigurationError(
        f"configure_optimizers() returned {type(result).__name__}: {why}. Accepted return values: {_ACCEPTED}."
    )


def _scheduler_config(value: Any, result: Any, monitor: str | None = None, custom_step: bool = False,
                      automatic: bool = True) -> SchedulerConfig:
    """One scheduler (or scheduler dict) checked. With manual optimization the Trainer steps no scheduler, so
    neither the stepping API nor a `monitor` is required, and the keys about stepping are ignored (as in
    Lightning, with a warning)."""
    if isinstance(value, Mapping):
        unknown = set(value) - _SCHEDULER_KEYS
        if "scheduler" not in value or unknown:
            raise _bad(result, f"a scheduler dict needs the key 'scheduler' and only {sorted(_SCHEDULER_KEYS)}")
        config = SchedulerConfig(**dict(value))
    else:
        config = SchedulerConfig(scheduler=value)
    config.monitor = config.monitor or monitor
    if config.reduce_on_plateau is None:  # resolved, as Lightning's config shows it
        config.reduce_on_plateau = isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if not hasattr(config.scheduler, "state_dict"):
        raise _bad(result, f"{type(config.scheduler).__name__} is not an LR scheduler (it has no state_dict() to "
                           "checkpoint)")
    if not automatic:
        ignored = sorted(set(value) & _STEPPING_KEYS) if isinstance(value, Mapping) else []
        if ignored:
            rank_zero_warn(f"the scheduler dict sets {ignored}, which manual optimization ignores: the Trainer steps "
                           "no scheduler then; call `scheduler.step()` in training_step (self.lr_schedulers()).",
                           category=RuntimeWarning)
        return config
    _check_stepping(config, result, custom_step)
    return config


def _check_stepping(config: SchedulerConfig, result: Any, custom_step: bool) -> None:
    """How the Trainer will step a scheduler of automatic optimization: its API, interval, frequency and monitor."""
    if not custom_step and not isinstance(config.scheduler, _TORCH_SCHEDULERS):
        raise MisconfigurationError(
            f"the scheduler {type(config.scheduler).__name__} does not follow torch's LRScheduler API. Override "
            "TrainModule.lr_scheduler_step(scheduler, metric) to step it your way (e.g. "
            "`scheduler.step(epoch=self.current_epoch)`)."
        )
    if config.interval not in ("epoch", "step"):
        raise _bad(result, f"scheduler interval {config.interval!r} must be 'epoch' or 'step'")
    if isinstance(config.frequency, bool) or not isinstance(config.frequency, int) or config.frequency < 1:
        raise _bad(result, f"scheduler frequency {config.frequency!r} must be an int >= 1")
    if config.needs_metric and not config.monitor:
        raise _bad(result, "ReduceLROnPlateau needs a 'monitor' key naming a logged metric")
    if isinstance(config.scheduler, torch.optim.lr_scheduler.OneCycleLR) and config.interval == "epoch":
        rank_zero_warn("OneCycleLR is stepped once per epoch here ('interval': 'epoch', the default); it is built to "
                       "step at every optimizer step: give the scheduler dict 'interval': 'step'.",
                       category=RuntimeWarning)


def _from_dict(d: Mapping, result: Any, custom_step: bool, automatic: bool = True) -> OptimizerSetup:
    if "optimizer" not in d or not isinstance(d["optimizer"], Optimizer):
        raise _bad(result, "a dict must hold an Optimizer under 'optimizer'")
    unknown = set(d) - {"optimizer", "lr_scheduler", "monitor"}
    if unknown:
        raise _bad(result, f"unknown keys {sorted(unknown)} in the optimizer dict")
    setup = OptimizerSetup([d["optimizer"]])
    if d.get("lr_scheduler") is not None:
        setup.schedulers.append(_scheduler_config(d["lr_scheduler"], result, d.get("monitor"), custom_step, automatic))
    return setup


def normalize_optimizers(result: Any, *, allow_none: bool = False, custom_scheduler_step: bool = False,
                         automatic: bool = True) -> OptimizerSetup:
    """Turn any accepted return value of configure_optimizers() into an OptimizerSetup.

    Schedulers must be torch's, unless `custom_scheduler_step` (the module overrides `lr_scheduler_step`).
    """
    if result is None:
        if allow_none:
            return OptimizerSetup()
        rank_zero_warn("configure_optimizers() returned None: this fit will run with no optimizer (training_step and "
                       "backward run, no weight changes, as in Lightning). Return an optimizer to train.")
        return OptimizerSetup([NoOptimizer()])
    if isinstance(result, Optimizer):
        return OptimizerSetup([result])
    if isinstance(result, Mapping):
        setup = _from_dict(result, result, custom_scheduler_step, automatic)
    elif isinstance(result, Sequence) and not isinstance(result, str):
        setup = _from_sequence(result, custom_scheduler_step, automatic)
    else:
        raise _bad(result, "unsupported type")
    _check_attached(setup)
    return setup


def _check_attached(setup: OptimizerSetup) -> None:
    """Every scheduler steps an optimizer that configure_optimizers returned (Lightning's check): one built on
    another optimizer would change learning rates nobody trains with."""
    for config in setup.schedulers:
        optimizer = getattr(config.scheduler, "optimizer", None)
        if optimizer is not None and not any(optimizer is opt for opt in setup.optimizers):
            raise MisconfigurationError(
                f"configure_optimizers() returned the scheduler {type(config.scheduler).__name__} of an optimizer it "
                "did not return: build each scheduler on one of the returned optimizers, or return that optimizer too."
            )


def _from_sequence(result: Sequence, custom_step: bool, automatic: bool = True) -> OptimizerSetup:
    """`(optimizers, schedulers)`, a list of optimizers, or a list of optimizer dicts."""
    items = list(result)
    if isinstance(result, tuple) and len(items) == 2 and all(isinstance(i, Sequence) for i in items):
        opts, scheds = list(items[0]), list(items[1])
        if not opts or not all(isinstance(o, Optimizer) for o in opts):
            raise _bad(result, "the first element of the tuple must be a list of Optimizers")
        return OptimizerSetup(opts, [_scheduler_config(s, result, custom_step=custom_step, automatic=automatic)
                                     for s in scheds])
    if items and all(isinstance(o, Optimizer) for o in items):
        return OptimizerSetup(items)
    if items and all(isinstance(o, Mapping) for o in items):
        setup = OptimizerSetup()
        for d in items:
            part = _from_dict(d, result, custom_step, automatic)
            setup.optimizers += part.optimizers
            setup.schedulers += part.schedulers
        return setup
    raise _bad(result, "a list must hold only Optimizers or only optimizer dicts")


def step_scheduler(scheduler: Any, metric: Any) -> None:
    """Lightning's default `lr_scheduler_step`: `step()`, or `step(metric)` for a scheduler that monitors one."""
    if metric is None:
        scheduler.step()
    else:
        scheduler.step(metric)


class SchedulerStepper:
    """Steps schedulers at their interval and frequency, through `step_one(scheduler, metric)` (the module's
    `lr_scheduler_step`); reads the monitored metric for ReduceLROnPlateau-like ones."""

    def __init__(self, configs: list[SchedulerConfig],
                 step_one: Callable[[Any, Any], None] = step_scheduler) -> None:
        self.configs = configs  # read at each step: a callback may swap a scheduler in (StochasticWeightAveraging)
        self.step_one = step_one

    @property
    def has_step_schedulers(self) -> bool:
        return bool(self.configs) and any(c.interval == "step" for c in self.configs)  # per step: cheap when none

    def step(self, interval: str, count: int, metrics: Mapping[str, Any], plateau: bool | None = None) -> None:
        """Step schedulers of `interval` that are due at `count` (the batch index + 1 within the epoch, or finished
        epochs). `plateau` picks the ones that monitor a metric (True) or the others (False): Lightning steps the
        others right after the optimizer step, the monitoring ones once the metric exists (after validation, after
        `on_train_epoch_end`)."""
        for config in self.configs:
            if config.interval != interval or count % config.frequency:
                continue
            if plateau is not None and config.needs_metric != plateau:
                continue
            if config.needs_metric:
                value = metrics.get(config.monitor) if config.monitor else None  # set: checked when configured
                if value is None:
                    if config.strict:
                        raise MisconfigurationError(
                            f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged. "
                            f"Logged metrics: {sorted(metrics)}. Log it with self.log or fix 'monitor'."
                        )
                    rank_zero_warn(f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; with "
                                   "strict=False this step of the scheduler is skipped.", category=RuntimeWarning)
                    continue
                self.step_one(config.scheduler, float(value))
            else:
                self.step_one(config.scheduler, None)
