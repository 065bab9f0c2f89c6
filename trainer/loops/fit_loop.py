"""The fit loop and the training step. Flat, and blind to the strategy type: every difference
between single device, DP, DDP and ZeRO is behind `loop.strategy`. They take the run's `FitState`
(trainer/loops/fit_state.py), not the Trainer. Hook order: see trainer.hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from trainer.checkpoint import resume
from trainer.checkpoint.loop_position import Phase
from trainer.data import loaders as data
from trainer.data.sampling import resumable_sampler
from trainer.hooks import MONITORING, call_hook
from trainer.loops.automatic_optimization import TrainingClosure, step_window
from trainer.loops.evaluation_loop import run_evaluation
from trainer.loops.model_mode import zero_grad_before_validation
from trainer.ranks import preemption
from trainer.seed import capture_rng_state, restore_rng_state
from trainer.state import RunningStage

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState


def _detached(out: Any, loss: Tensor | None, detached: Tensor | None) -> Any:
    """What on_train_batch_end receives: the step output with the loss detached (as in Lightning); `detached` is the
    detached loss the closure returned, when it ran to the end (a skipped step detaches here)."""
    if loss is None:
        return out
    if detached is None:
        detached = loss.detach()
    if out is loss:
        return {"loss": detached}
    if isinstance(out, Mapping):
        return {**out, "loss": detached}
    return {"loss": detached}


def train_one_batch(loop: FitState, batch: Any, batch_idx: int, is_last: bool, is_last_micro: bool) -> Any:
    """Automatic optimization (trainer/loops/automatic_optimization.py): on the batch that closes its accumulation
    window (`is_last_micro`) the module's optimizer_step runs the closure (training_step, backward) and steps; other
    batches run the closure."""
    closure = TrainingClosure(loop, batch, batch_idx, is_last, is_last_micro)
    if is_last_micro:
        step_window(loop, batch_idx, closure)
    else:
        with loop.strategy.no_backward_sync(True):  # wraps forward and backward
            closure()
    out, detached = closure.output, closure.detached
    if detached is not None and out is closure.loss:  # the common output, a loss tensor: no call
        return {"loss": detached}
    return _detached(out, closure.loss, detached)


def train_one_batch_manual(loop: FitState, batch: Any, batch_idx: int, is_last: bool) -> Any:
    """Manual optimization: the step does its own backward and optimizer calls."""
    with loop.strategy.manual_step_context():
        out = loop.run_step("training_step", batch, batch_idx)
    loss = out.get("loss") if isinstance(out, Mapping) else out
    loop.control.after_training_step(loop, loss if isinstance(loss, Tensor) else None, is_last, False)
    return out


def run_train_epoch(loop: FitState) -> None:
    """One training epoch, with validation wherever it is due."""
    progress, schedule, position = loop.progress, loop.schedule, loop.position
    resume.before_epoch(loop)  # RNG of an epoch-boundary resume first: the loaders may be requested again next
    loop.request_train()
    loader, num_batches = loop.loaders.train, schedule.num_training_batches
    iterator, start = _start_epoch(loop, loader)
    runs_out, sampler, stopped = data.runs_out(loader, num_batches), resumable_sampler(loader), False
    position.before_fetch(sampler)
    last_seen, train_batch = False, _profiled_train_batch if loop.trainer.profiler.enabled else _train_batch
    for batch_idx, batch, is_last in data.iterate(iterator, num_batches, start):
        last_seen = is_last
        if not train_batch(loop, batch, batch_idx, is_last):
            break
        if is_last and runs_out:
            data.run_out(iterator)  # as a plain `for` loop over the loader does
        if schedule.has_validation or loop.scheduler_stepper.configs:  # nothing to do after the batch: no call
            _after_batch(loop, batch_idx, is_last)
        if schedule.stop_in_epoch():
            stopped = not is_last
            break
        position.before_fetch(sampler)
    else:
        if not last_seen and num_batches > start:  # the data ended before the announced last batch
            loop.control.ran_dry(loop)
            _stop_on_agreed_signal(loop)
    # the fit ends inside this epoch: checkpoints from here on continue it (trainer/checkpoint/loop_position.py)
    if stopped:
        resume.freeze_at_stop(loop)
    progress.epoch_finished = True
    _train_epoch_end(loop, complete=not stopped)


def _after_batch(loop: FitState, batch_idx: int, is_last: bool) -> None:
    """A validation when due (or before a requested stop), then the step schedulers that monitor a metric."""
    schedule = loop.schedule
    if schedule.val_due(batch_idx, is_last):
        _validate_during_fit(loop)
    elif schedule.stop_validation_due():
        _validate_before_stop(loop)
    if loop.automatic and schedule.window_ends(batch_idx, is_last):  # they may monitor a validation metric
        loop.scheduler_stepper.step("step", batch_idx + 1, loop.metrics.callback_metrics, plateau=True)


def _start_epoch(loop: FitState, loader: Any) -> tuple[Any, int]:
    """Epoch set-up up to the first batch: sampler epoch, hooks, the iterator (positioned on resume), count check,
    and a validation still due after the batch a mid-epoch checkpoint was taken at."""
    progress, schedule = loop.progress, loop.schedule
    num_batches = schedule.num_training_batches
    data.set_epoch(loader, progress.current_epoch)
    loop.trainer.state.stage = RunningStage.TRAINING
    call_hook(loop, "on_train_epoch_start")
    loop.strategy.sync_trainable_parameters()  # a callback may have unfrozen layers (callbacks/finetuning.py)
    iterator, start = resume.open_epoch(loop, loader)
    progress.epoch_batches, progress.epoch_finished = start, False
    loop.control.check_batch_counts(num_batches)
    if start and not progress.val_started and schedule.val_due(start - 1, start == num_batches):
        _validate_during_fit(loop)  # the save came before the validation due after that batch
    profiler = loop.trainer.profiler
    if profiler.enabled:  # each fetch timed under Lightning's action name
        iterator = iter(data.timed_fetches(iterator, profiler, "[_TrainingEpochLoop].train_dataloader_next"))
    return iterator, start


def _profiled_train_batch(loop: FitState, batch: Any, batch_idx: int, is_last: bool) -> bool:
    """`_train_batch` timed as Lightning's "run_training_batch" action (a profiler is on)."""
    with loop.trainer.profiler.action("run_training_batch"):
        return _train_batch(loop, batch, batch_idx, is_last)


def _train_batch(loop: FitState, batch: Any, batch_idx: int, is_last: bool) -> bool:
    """One batch with its hooks, logging and an agreed stop; False when on_train_batch_start returned -1."""
    progress, results, metrics, position = loop.progress, loop.train_results, loop.metrics, loop.position
    position.phase = Phase.BATCH_STARTED
    progress.val_started, loop.is_last_batch = False, is_last
    metrics.train_batch_starts()
    batch = loop.to_device(batch, 0)
    results.set_batch(batch)
    silent, stepper = loop.hooks.silent, loop.scheduler_stepper  # silent: hooks nobody overrides (trainer/hooks.py)
    if "on_train_batch_start" not in silent and call_hook(loop, "on_train_batch_start", batch, batch_idx) == -1:
        if loop.automatic and stepper.configs:  # the epoch ends here: its schedulers step as after its last batch
            stepper.step("epoch", progress.current_epoch + 1, metrics.callback_metrics, plateau=False)
        return False
    if loop.automatic:
        stepped = loop.schedule.window_ends(batch_idx, is_last)
        outputs = train_one_batch(loop, batch, batch_idx, is_last, stepped)
        if is_last and stepper.configs:  # the epoch's schedulers step after its last batch, before its end hooks
            stepper.step("epoch", progress.current_epoch + 1, metrics.callback_metrics, plateau=False)
    else:
        stepped, outputs = True, train_one_batch_manual(loop, batch, batch_idx, is_last)
    progress.epoch_batches += 1
    progress.total_batches += 1
    position.phase = Phase.BETWEEN_BATCHES
    if "on_train_batch_end" not in silent:
        call_hook(loop, "on_train_batch_end", outputs, batch, batch_idx)
    metrics.step_end(results, stepped, progress.current_epoch, loop.schedule.should_stop)
    if loop.control.stop_signal:  # agreed by every rank after this same batch
        preemption.stop_and_exit(loop.trainer, loop.control.stop_signal)
    return True


def _stop_on_agreed_signal(loop: FitState) -> None:
    if loop.control.stop_signal:  # agreed by every rank after this same batch
        preemption.stop_and_exit(loop.trainer, loop.control.stop_signal)


def _validate_during_fit(loop: FitState) -> None:
    loop.progress.val_started = True
    zero_grad_before_validation(loop.strategy.module, loop.window_has_loss, loop.trainer.profiler)
    loop.position.validation_started(capture_rng_state())
    with loop.control.outside_steps():  # no step bound on collectives during validation
        run_evaluation(loop, RunningStage.VALIDATING)
    loop.position.validation_finished()
    loop.schedule.validation_ran()
    loop.trainer.state.stage = RunningStage.TRAINING


def _validate_before_stop(loop: FitState) -> None:
    """The validation Lightning runs after the batch that requested a stop, outside the validation schedule. It
    leaves the RNG as it found it, so a checkpoint taken after the stop resumes exactly as the run that never
    stopped (which has no validation there)."""
    rng = capture_rng_state()
    zero_grad_before_validation(loop.strategy.module, loop.window_has_loss, loop.trainer.profiler)
    loop.position.validation_started(rng)
    with loop.control.outside_steps():
        run_evaluation(loop, RunningStage.VALIDATING)
    loop.position.validation_finished()
    loop.trainer.state.stage = RunningStage.TRAINING
    restore_rng_state(rng)


def _train_epoch_end(loop: FitState, complete: bool) -> None:
    """Epoch metrics (readable in on_train_epoch_end), the hook, late metrics, the epoch schedulers that monitor a
    metric (the others stepped after the epoch's last batch).

    Epoch-interval schedulers step only after a complete epoch (as in Lightning): not when the fit
    stops inside it, so that a resume continuing that epoch steps them once, at its real end. Manual optimization
    steps its schedulers itself (as in Lightning).
    """
    results, p, metrics = loop.train_results, loop.progress, loop.metrics
    loop.control.epoch_ends()  # epoch-end hooks and the next epoch's data loaders: no step bound
    metrics.settle_step_values()
    metrics.epoch_end(results.epoch_end("training epoch end"), metrics.train_epoch_step, p.current_epoch)
    call_hook(loop, "on_train_epoch_end")  # the callbacks, then the module
    metrics.epoch_end(results.epoch_end("on_train_epoch_end"), metrics.train_epoch_step, p.current_epoch)
    call_hook(loop, "on_train_epoch_end" + MONITORING)  # then ModelCheckpoint & co., seeing what the module logged
    results.reset_metric_objects()  # after the epoch-end hooks, so compute() in them gives the epoch value
    if complete and loop.automatic:
        loop.scheduler_stepper.step("epoch", p.current_epoch + 1, metrics.callback_metrics, plateau=True)
    p.current_epoch += 1
    p.epoch_finished, p.epoch_batches, p.epoch_opened = False, 0, False


def run_fit(loop: FitState) -> None:
    """Sanity check, the training loaders, then epochs until a limit (max_epochs, max_steps, max_time, should_stop)
    is hit; Lightning's order of loader requests and hooks.

    A Trainer that already reached its limit trains nothing (as in Lightning) and says so. The sanity check leaves
    every RNG as it found it, so neither it nor the validation loaders it requests shift the run's random draws.
    """
    loop.schedule.has_validation = loop.validation_enabled
    if loop.schedule.has_validation and loop.spec.num_sanity_val_steps != 0:
        rng = capture_rng_state()
        loop.position.validation_started(rng)  # a checkpoint taken in it records the RNG from before it
        run_evaluation(loop, RunningStage.SANITY_CHECKING)
        restore_rng_state(rng)
        loop.position.validation_finished()
    if not loop.request_train():
        return
    loop.schedule.set_batches(loop.loaders.num_train, loop.schedule.has_validation)
    if loop.schedule.num_training_batches == 0:
        rank_zero_info("`Trainer.fit` stopped: the training loader has no batches.")
        return
    reached = loop.schedule.limit_reached()
    if reached is not None:
        rank_zero_info(
            f"`Trainer.fit` stopped: {reached} reached; this Trainer has nothing left to train. To train further, "
            "create a Trainer with a higher limit and call fit(model, ckpt_path=<a checkpoint of this run>)."
        )
        return
    if loop.schedule.validates_this_epoch() and "val" not in loop.loaders.loaded:
        loop.request_eval(RunningStage.VALIDATING)  # as Lightning does, for the progress bar's totals
    _warn_if_in_eval_mode(loop.strategy.module)
    call_hook(loop, "on_train_start")
    while not loop.schedule.fit_done():
        with loop.trainer.profiler.action("run_training_epoch"):
            run_train_epoch(loop)
    late_signal = loop.control.stop_signal_after_fit()  # e.g. Ctrl-C during the final validation
    if late_signal:
        preemption.stop_and_exit(loop.trainer, late_signal)
    call_hook(loop, "on_train_end")


def _warn_if_in_eval_mode(module: Any) -> None:
    """The loop leaves every submodule's mode as it is (Lightning's rule): say so when some start in eval mode."""
    in_eval = [name for name, sub in module.named_modules() if not sub.training]
    if in_eval:
        rank_zero_warn(f"{len(in_eval)} module(s) of {type(module).__name__} are in eval mode as training starts "
                       f"({', '.join(repr(n) if n else 'the module itself' for n in in_eval[:3])}"
                       f"{', ...' if len(in_eval) > 3 else ''}); the Trainer trains them that way. Call .train() on "
                       "them first if that is not what you want.")
