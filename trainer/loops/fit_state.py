"""The loop's own state, in one typed object: what the loops, resume, control, checkpoint and rank-result code
read and change while a run goes on.

Why one object: the loops used to share the Trainer through dozens of reads of its private attributes, and the
results in use were switched by pointer swaps in five places. Here each piece has one owner and a type; the
Trainer builds one `FitState` and is a facade over it (its public properties read from here), and the modules
that run the loop take the `FitState` instead of the Trainer. The results in use change only through
`using_results`, which puts the previous ones back however the block ends.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from strategies.base import Strategy
from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import ConfigError
from strategies.model.wrapped_optimizer import StrategyOptimizer
from trainer.checkpoint.loop_position import LoopPosition
from trainer.core.optimizer_setup import SchedulerConfig, SchedulerStepper
from trainer.data.batch_transfer import BatchTransfer
from trainer.data.sampling import resumable_sampler
from trainer.data.stage_loaders import StageLoaders
from trainer.hooks import STRATEGY, HookDispatcher
from trainer.loops.predictions import PredictLoop
from trainer.loops.schedule import FitSchedule
from trainer.metrics.results import ResultCollection
from trainer.metrics.routing import MetricsRouter
from trainer.ranks.agreement import ControlPlane
from trainer.setup.flags import RunSpec
from trainer.state import Progress, RunningStage, TrainerFn

if TYPE_CHECKING:
    from trainer.checkpoint.resume import ResumePoint
    from trainer.trainer import Trainer


@dataclass(eq=False)
class FitState:
    """Everything a run's loops keep between two batches, and the Trainer they report to.

    Attributes:
        trainer: the public facade; hooks receive it, and its callbacks, loggers and datamodule are read there.
        spec: the frozen flags.
        strategy: the Strategy instance.
        progress: the counters that say where the fit loop is (saved in checkpoints).
        position: what a checkpoint taken now records as the loop position.
        schedule: when validation is due and when the fit stops.
        control: the per-step agreement between ranks.
        metrics: where logged values go (callback, logged and progress-bar metrics, the loggers).
        hooks: the hook dispatcher.
        train_results: what `self.log` collects during training.
        results: the results in use now (the training ones, or an evaluation's); see `using_results`.
        loaders: the run's dataloaders and their batch limits.
        optimizers: the optimizers as the strategy set them up.
        lr_scheduler_configs: the schedulers from configure_optimizers, with their interval and frequency.
        scheduler_stepper: steps the schedulers at their interval.
        user_optimizers: what `TrainModule.optimizers()` returns and `optimizer_step` receives: the optimizers
            wrapped so that `.step(closure)` goes through the strategy (strategies/model/wrapped_optimizer.py).
        automatic: automatic (True) or manual optimization.
        custom_clipping: the module overrides `configure_gradient_clipping` (called at every step then).
        window_has_loss: the open accumulation window has a backward in it.
        step_taken: the optimizer stepped in the running `optimizer_step` (False: skipped by an AMP overflow).
        is_last_batch: the training batch that runs is the last of its epoch (`Trainer.is_last_batch`).
        resume_point: where a restored checkpoint left off, consumed by the next training epoch.
        module: the TrainModule attached to the run (None before the first one).
        compiler: the compile context of the `torch.compile` call `module` came wrapped in (None: not compiled);
            the strategy compiles the module's forward with it in every run (strategies/model/compiled.py).
        launcher_pid: the process that built the Trainer; a rank in another one (spawn) sends its outcome back.
        transfer: the batch-transfer hooks (trainer/data/batch_transfer.py), picked once per run.
        no_batch_idx: the step methods whose signature takes no `batch_idx` (trainer/setup/step_signature.py).
        predict_loop: what predict keeps: predictions and the batches' dataset indices (trainer/loops/predictions.py).
    """

    trainer: Trainer
    spec: RunSpec
    strategy: Strategy
    progress: Progress
    position: LoopPosition
    schedule: FitSchedule
    control: ControlPlane
    metrics: MetricsRouter
    hooks: HookDispatcher
    train_results: ResultCollection
    results: ResultCollection
    loaders: StageLoaders = field(default_factory=StageLoaders)
    optimizers: list[Optimizer] = field(default_factory=list)
    lr_scheduler_configs: list[SchedulerConfig] = field(default_factory=list)
    scheduler_stepper: SchedulerStepper = field(default_factory=lambda: SchedulerStepper([]))
    user_optimizers: list[StrategyOptimizer] = field(default_factory=list)
    automatic: bool = True
    custom_clipping: bool = False
    window_has_loss: bool = False
    step_taken: bool = False
    is_last_batch: bool = False  # the training batch that runs is its epoch's last
    resume_point: ResumePoint | None = None
    module: Any = None
    compiler: Any = None
    launcher_pid: int = field(default_factory=os.getpid)
    transfer: BatchTransfer = field(default_factory=BatchTransfer)
    no_batch_idx: frozenset[str] = frozenset()
    predict_loop: PredictLoop = field(default_factory=PredictLoop)

    @contextmanager
    def using_results(self, results: ResultCollection) -> Iterator[ResultCollection]:
        """`self.log` goes to `results` inside the block; the results in use before come back after it."""
        previous, self.results = self.results, results
        try:
            yield results
        finally:
            self.results = previous

    def new_eval_results(self) -> ResultCollection:
        """A fresh collection for one evaluation, reduced and key-checked like the training one."""
        return ResultCollection(self.strategy.all_reduce, self.control.check_sync_keys)

    def run_step(self, name: str, *args: Any) -> Any:
        """`module.<name>(*args)` through the strategy's wrapper, with `self.log` attributed to that step."""
        results = self.results
        previous, results.current_fx = results.current_fx, name  # inside optimizer_step: back to it afterwards
        if name in self.no_batch_idx:  # `training_step(self, batch)`: called without batch_idx, as in Lightning
            args = args[:1] + args[2:]
        try:
            profiler = self.trainer.profiler
            if profiler.enabled:  # Lightning's action name, e.g. "[Strategy]SingleDeviceStrategy.training_step"
                with profiler.profile(f"{STRATEGY}{type(self.strategy).__name__}.{name}"):
                    return self.strategy.step(name, *args)
            return self.strategy.step(name, *args)
        finally:
            results.current_fx = previous

    def backward(self, loss: Any) -> None:
        """The strategy's backward (precision, then the module's `backward` hook), timed as Lightning names it."""
        profiler = self.trainer.profiler
        if profiler.enabled:
            with profiler.profile(f"{STRATEGY}{type(self.strategy).__name__}.backward"):
                self.strategy.backward(loss)
        else:
            self.strategy.backward(loss)

    def to_device(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """The batch on the run's device, through the batch-transfer hooks when the user defined any."""
        if not self.transfer.active:  # no hook of the user's: the strategy's move, one call less per batch
            return self.strategy.batch_to_device(batch)
        return self.transfer(self.strategy, batch, dataloader_idx)

    def clip_gradients(self, optimizer: Optimizer) -> None:
        """Clip as `gradient_clip_val` / `gradient_clip_algorithm` say; nothing when the value is None or 0."""
        value = self.spec.gradient_clip_val
        if value is None or value == 0:
            return
        if self.spec.gradient_clip_algorithm == "norm":
            self.strategy.clip_gradients(optimizer, max_norm=value)
        else:
            self.strategy.clip_gradients(optimizer, max_value=value)

    @property
    def validation_enabled(self) -> bool:
        """Lightning's `enable_validation`: the fit has a validation source, a `validation_step` and a non-zero
        `limit_val_batches` (whether the loaders hold any batch is known once they are requested)."""
        from trainer.core.module import TrainModule
        from trainer.hooks import is_overridden

        return self.spec.limit_val_batches != 0 and is_overridden(self.module, "validation_step", TrainModule) \
            and self.loaders.defined("val")

    def request_train(self) -> bool:
        """The fit's training loaders: requested when first needed and again when `reload_dataloaders_every_n_epochs`
        says so; the schedule follows their batch count. False when there is nothing to train
        (`limit_train_batches=0`: nothing is requested, as in Lightning)."""
        if self.spec.limit_train_batches == 0:
            return False
        epoch, loaders = self.progress.current_epoch, self.loaders
        if not loaders.reload_due("train", epoch):
            return True
        again = "train" in loaders.loaded
        loaders.load("train", epoch)
        _check_train_batches(self.spec, loaders.num_train, bool(self.trainer.loggers))
        self.schedule.set_batches(loaders.num_train, self.schedule.has_validation)
        point = self.resume_point
        sampler = resumable_sampler(loaders.train)
        if point is not None and point.sampler_state and sampler is not None:
            sampler.keep_run_seed(point.sampler_state)  # the distributed shuffling seed of the run it continues
        if again:
            _draw_as_lightning_reload(loaders.train)
        return True

    def request_eval(self, stage: RunningStage) -> None:
        """The loaders of an evaluation: for validate/test/predict every run requests them; in fit (sanity check and
        validations) they are requested once and again when a reload is due. The sanity check's request counts as
        one only in an epoch that validates (Lightning's rule)."""
        loaders, epoch = self.loaders, self.progress.current_epoch
        name = {RunningStage.TESTING: "test", RunningStage.PREDICTING: "predict"}.get(stage, "val")
        if getattr(self.spec, f"limit_{name}_batches") == 0:  # a stage switched off requests nothing
            return
        if name != "val" or self.trainer.state.fn != TrainerFn.FITTING:
            loaders.load(name)
        elif loaders.reload_due("val", epoch):
            loaders.load("val", epoch)
            if stage == RunningStage.SANITY_CHECKING and not self.schedule.validates_this_epoch():
                loaders.requested_at["val"] = -math.inf

    def reload_dataloaders(self) -> None:
        """Build this run's loaders again from their sources, and the fit's schedule on the new batch counts."""
        self.loaders.reload()
        if self.trainer.state.fn == TrainerFn.FITTING and "train" in self.loaders.loaded:
            self.schedule.set_batches(self.loaders.num_train, self.schedule.has_validation)

    def eval_loaders(self, stage: RunningStage) -> tuple[list[Any], list[int | float]]:
        """The loaders an evaluation stage runs over, and how many batches of each (sanity: its few steps)."""
        if stage == RunningStage.TESTING:
            return self.loaders.test, self.loaders.test_limits
        if stage == RunningStage.PREDICTING:
            return self.loaders.predict, self.loaders.predict_limits
        if stage == RunningStage.SANITY_CHECKING:
            return self.loaders.val, [self.schedule.sanity_steps(n) for n in self.loaders.val_limits]
        return self.loaders.val, self.loaders.val_limits

    def optimizers_for_user(self, wrapped: bool = True) -> list[Any]:
        """What `TrainModule.optimizers()` hands out: the wrappers that step through the strategy, or (wrapped=False)
        the optimizers themselves."""
        return self.user_optimizers if wrapped else self.optimizers


def _check_train_batches(spec: RunSpec, batches: int | float, has_loggers: bool) -> None:
    """Lightning's checks once the training batch count is known: an int `val_check_interval` beyond it (with
    validation every epoch) never validates, and a `log_every_n_steps` beyond it logs no step at all."""
    interval = spec.val_check_interval
    if isinstance(interval, int) and interval > batches and spec.check_val_every_n_epoch is not None \
            and spec.limit_val_batches != 0:
        raise ConfigError(
            f"val_check_interval={interval} is more than the {batches} training batches of an epoch, so this fit would "
            "never validate: give at most that many, set limit_val_batches=0 to train without validation, or "
            "check_val_every_n_epoch=None to count the batches across epochs."
        )
    if has_loggers and batches < spec.log_every_n_steps and not spec.fast_dev_run:
        rank_zero_warn(f"the epoch has {batches} training batches, fewer than log_every_n_steps="
                       f"{spec.log_every_n_steps}: step values reach the loggers less than once per epoch. Lower "
                       "log_every_n_steps to see more of them.")


def _draw_as_lightning_reload(train: Any) -> None:
    """Lightning opens a reloaded training loader's iterator twice (when it requests it, and at the epoch start),
    and each DataLoader iterator draws its worker base seed from the RNG: draw that seed once per DataLoader too
    (without starting an iterator, so no worker starts), and the epoch's shuffle is the one Lightning gives."""
    inner = getattr(train, "inner_loaders", None)
    for loader in inner() if callable(inner) else [train]:
        if isinstance(loader, DataLoader):
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)

