"""The fit, evaluation and predict loops. Flat, and blind to the strategy type: every difference
between single device, DP, DDP and ZeRO is behind `loop.strategy`. They take the run's `FitState`
(trainer/fit_state.py), not the Trainer. Hook order: see trainer.hooks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from strategies.distributed import rank_zero_info
from trainer import data, preemption, resume
from trainer.hooks import call_hook
from trainer.model_mode import ModuleMode, zero_grad_before_validation
from trainer.optimizer_path import TrainingClosure, step_window
from trainer.position import Phase
from trainer.sampling import resumable_sampler
from trainer.seed import capture_rng_state, restore_rng_state
from trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from trainer.fit_state import FitState


def _detached(out: Any, loss: Tensor | None) -> Any:
    """What on_train_batch_end receives: the step output with the loss detached (as in Lightning)."""
    if loss is None:
        return out
    if out is loss:
        return {"loss": loss.detach()}
    if isinstance(out, Mapping):
        return {**out, "loss": loss.detach()}
    return {"loss": loss.detach()}


def train_one_batch(loop: FitState, batch: Any, batch_idx: int, is_last: bool) -> Any:
    """Automatic optimization (trainer/optimizer_path.py): on the batch that closes its accumulation window the
    module's optimizer_step runs the closure (training_step, backward) and steps; other batches run the closure."""
    is_last_micro = loop.schedule.window_ends(batch_idx, is_last)
    closure = TrainingClosure(loop, batch, batch_idx, is_last, is_last_micro)
    if is_last_micro:
        step_window(loop, batch_idx, closure)
    else:
        with loop.strategy.no_backward_sync(True):  # wraps forward and backward
            closure()
    return _detached(closure.output, closure.loss)


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
    loop.reload_if_due("train")
    loader, num_batches = loop.loaders.train, schedule.num_training_batches
    iterator, start = _start_epoch(loop, loader)
    runs_out, sampler, stopped = data.runs_out(loader, num_batches), resumable_sampler(loader), False
    position.before_fetch(sampler)
    last_seen, action = False, loop.trainer.profiler.action  # a shared no-op context when not profiling
    for batch_idx, batch, is_last in data.iterate(iterator, num_batches, start):
        last_seen = is_last
        with action("run_training_batch"):
            trained = _train_batch(loop, batch, batch_idx, is_last)
        if not trained:
            break
        if is_last and runs_out:
            data.run_out(iterator)  # as a plain `for` loop over the loader does
        if schedule.val_due(batch_idx, is_last):
            _validate_during_fit(loop)
        if schedule.stop_in_epoch():
            stopped = not is_last
            break
        position.before_fetch(sampler)
    else:
        if not last_seen and num_batches > start:  # the data ended before the announced last batch
            loop.control.ran_dry(loop)
            _stop_on_agreed_signal(loop)
    if stopped:  # the fit ends inside this epoch: checkpoints from here on continue it (trainer/position.py)
        resume.freeze_at_stop(loop)
    progress.epoch_finished = True
    _train_epoch_end(loop, complete=not stopped)


def _start_epoch(loop: FitState, loader: Any) -> tuple[Any, int]:
    """Epoch set-up up to the first batch: sampler epoch, hooks, the iterator (positioned on resume), count check,
    and a validation still due after the batch a mid-epoch checkpoint was taken at."""
    progress, schedule = loop.progress, loop.schedule
    num_batches = schedule.num_training_batches
    data.set_epoch(loader, progress.current_epoch)
    loop.trainer.state.stage = RunningStage.TRAINING
    loop.strategy.module.train()
    call_hook(loop, "on_train_epoch_start")
    loop.strategy.sync_trainable_parameters()  # a callback may have unfrozen layers (callbacks/finetuning.py)
    iterator, start = resume.open_epoch(loop, loader)
    progress.epoch_batches, progress.epoch_finished = start, False
    loop.control.check_batch_counts(num_batches)
    if start and not progress.val_started and schedule.val_due(start - 1, start == num_batches):
        _validate_during_fit(loop)  # the save came before the validation due after that batch
    return iterator, start


def _train_batch(loop: FitState, batch: Any, batch_idx: int, is_last: bool) -> bool:
    """One batch with its hooks, logging and an agreed stop; False when on_train_batch_start returned -1."""
    progress, results, metrics, position = loop.progress, loop.train_results, loop.metrics, loop.position
    position.phase = Phase.BATCH_STARTED
    progress.val_started = False
    metrics.train_batch_starts()
    batch = loop.to_device(batch, 0)
    results.set_batch(batch)
    if call_hook(loop, "on_train_batch_start", batch, batch_idx) == -1:
        return False
    step_fn = train_one_batch if loop.automatic else train_one_batch_manual
    outputs = step_fn(loop, batch, batch_idx, is_last)
    progress.epoch_batches += 1
    progress.total_batches += 1
    position.phase = Phase.BETWEEN_BATCHES
    call_hook(loop, "on_train_batch_end", outputs, batch, batch_idx)
    stepped = not loop.automatic or loop.schedule.window_ends(batch_idx, is_last)
    metrics.step_end(results, stepped, progress.current_epoch, loop.schedule.should_stop)
    _stop_on_agreed_signal(loop)
    return True


def _stop_on_agreed_signal(loop: FitState) -> None:
    if loop.control.stop_signal:  # agreed by every rank after this same batch
        preemption.stop_and_exit(loop.trainer, loop.control.stop_signal)


def _validate_during_fit(loop: FitState) -> None:
    loop.reload_if_due("val")
    loop.progress.val_started = True
    zero_grad_before_validation(loop.strategy.module, loop.window_has_loss)
    loop.position.validation_started(capture_rng_state())
    with loop.control.outside_steps():  # no step bound on collectives during validation
        run_evaluation(loop, RunningStage.VALIDATING)
    loop.position.validation_finished()
    loop.schedule.validation_ran()
    loop.trainer.state.stage = RunningStage.TRAINING


def _train_epoch_end(loop: FitState, complete: bool) -> None:
    """Epoch metrics (readable in on_train_epoch_end), the hook, late metrics, epoch schedulers.

    Epoch-interval schedulers step only after a complete epoch (as in Lightning): not when the fit
    stops inside it, so that a resume continuing that epoch steps them once, at its real end.
    """
    results, p, metrics = loop.train_results, loop.progress, loop.metrics
    loop.control.epoch_ends()  # epoch-end hooks and the next epoch's data loaders: no step bound
    metrics.epoch_end(results.epoch_end("training epoch end"), metrics.train_epoch_step, p.current_epoch)
    call_hook(loop, "on_train_epoch_end")
    metrics.epoch_end(results.epoch_end("on_train_epoch_end"), metrics.train_epoch_step, p.current_epoch)
    results.reset_metric_objects()  # after the epoch-end hooks, so compute() in them gives the epoch value
    if complete:
        loop.scheduler_stepper.step("epoch", p.current_epoch + 1, metrics.callback_metrics)
    p.current_epoch += 1
    p.epoch_finished, p.epoch_batches, p.epoch_opened = False, 0, False


def run_fit(loop: FitState) -> None:
    """Sanity check, then epochs until a limit (max_epochs, max_steps, max_time, should_stop) is hit.

    A Trainer that already reached its limit trains nothing (as in Lightning) and says so. The
    sanity check leaves every RNG as it found it, so it does not shift the run's random draws.
    """
    reached = loop.schedule.limit_reached()
    if reached is not None:
        rank_zero_info(
            f"`Trainer.fit` stopped: {reached} reached; this Trainer has nothing left to train. To train further, "
            "create a Trainer with a higher limit and call fit(model, ckpt_path=<a checkpoint of this run>)."
        )
        return
    val_limits = loop.loaders.val_limits
    if val_limits and loop.schedule.sanity_steps(max(val_limits)):
        rng = capture_rng_state()
        loop.position.validation_started(rng)  # a checkpoint taken in it records the RNG from before it
        run_evaluation(loop, RunningStage.SANITY_CHECKING)
        restore_rng_state(rng)
        loop.position.validation_finished()
        loop.loaders.sanity_checked()
    call_hook(loop, "on_train_start")
    while not loop.schedule.fit_done():
        with loop.trainer.profiler.action("run_training_epoch"):
            run_train_epoch(loop)
    late_signal = loop.control.stop_signal_after_fit()  # e.g. Ctrl-C during the final validation
    if late_signal:
        preemption.stop_and_exit(loop.trainer, late_signal)
    call_hook(loop, "on_train_end")


_PREFIX = {RunningStage.VALIDATING: "validation", RunningStage.SANITY_CHECKING: "validation",
           RunningStage.TESTING: "test"}
_EVAL_ACTION = {RunningStage.VALIDATING: "run_validation", RunningStage.SANITY_CHECKING: "run_sanity_check",
                RunningStage.TESTING: "run_test"}  # profiler action names


def run_evaluation(loop: FitState, stage: RunningStage) -> list[dict[str, float]]:
    """Validation, sanity check or test over every eval loader; returns one metrics dict per loader."""
    s, prefix, state = loop.strategy, _PREFIX[stage], loop.trainer.state
    module, mode = s.module, ModuleMode()
    previous_stage, state.stage = state.stage, stage
    with loop.using_results(loop.new_eval_results()) as results:
        if stage == RunningStage.SANITY_CHECKING:
            call_hook(loop, "on_sanity_check_start")
        mode.enter(module, prefix)  # on_{validation,test}_model_eval
        call_hook(loop, f"on_{prefix}_start")
        call_hook(loop, f"on_{prefix}_epoch_start")
        loaders, limits = loop.eval_loaders(stage)  # after the start hooks: BatchSizeFinder may rebuild them
        many = len(loaders) > 1
        with loop.strategy.evaluation_context(_inference_mode(loop)), \
                loop.trainer.profiler.action(_EVAL_ACTION[stage]):
            for dl_idx, (loader, limit) in enumerate(zip(loaders, limits, strict=True)):
                results.key_suffix = f"/dataloader_idx_{dl_idx}" if many else ""
                _evaluate_loader(loop, results, loader, limit, prefix, (dl_idx,) if many else ())
        results.key_suffix = ""
        metrics = _eval_epoch_end(loop, results, stage, prefix)
        if stage == RunningStage.VALIDATING:
            loop.position.validation_finished()  # a checkpoint from on_validation_end on counts it as done
        call_hook(loop, f"on_{prefix}_end")
        mode.leave(module, prefix)  # on_{validation,test}_model_train, or the modes from before
        if stage == RunningStage.SANITY_CHECKING:
            call_hook(loop, "on_sanity_check_end")
    state.stage = previous_stage
    return _split_by_loader(metrics, len(loaders))


def _evaluate_loader(loop: FitState, results: Any, loader: Any, limit: int | float, prefix: str,
                     extra: tuple[int, ...]) -> None:
    """One evaluation loader. Its shards may hold different numbers of batches on different ranks (no padding, or
    no length): from the first step some rank may lack, every step is a round that every rank joins
    (`reduce_eval_step`, before and after the batch-end hook), so a per-step sync_dist value never leaves a rank
    waiting; a rank that has run out joins the remaining rounds with nothing to add."""
    control = loop.control
    counts = control.eval_batch_counts(limit)  # None: the same known count on every rank (or one process)
    joined_from = math.inf if counts is None else max(min(counts), 0)  # counts known and different: the fewest
    more = counts is not None  # whether this rank must join the round at joined_from (or after its last step)
    for batch_idx, batch, is_last in data.iterate(loader, limit):
        results.defer_eval_sync = joined = batch_idx >= joined_from
        batch = loop.to_device(batch, extra[0] if extra else 0)
        results.set_batch(batch)
        call_hook(loop, f"on_{prefix}_batch_start", batch, batch_idx, *extra)
        out = loop.run_step(f"{prefix}_step", batch, batch_idx, *extra)
        if joined:  # reduced before the batch-end hook reads it, as a value reduced in self.log would be
            control.reduce_eval_step(results)
        call_hook(loop, f"on_{prefix}_batch_end", out, batch, batch_idx, *extra)
        if joined:
            more = control.reduce_eval_step(results, more=not is_last)
    results.defer_eval_sync = False
    while counts is not None and more:  # rounds of steps this rank does not have
        control.reduce_eval_step(results)
        more = control.reduce_eval_step(results)


def _eval_epoch_end(loop: FitState, results: Any, stage: RunningStage, prefix: str) -> dict[str, float]:
    """Epoch metrics (readable in the epoch-end hook), the hook, late metrics; sanity checks log nothing."""
    if stage == RunningStage.SANITY_CHECKING:
        call_hook(loop, f"on_{prefix}_epoch_end")
        results.reset()  # after the hook: a metric's compute() in it sees the sanity batches, as in Lightning
        return {}
    step = loop.metrics.logging_step
    computed = results.epoch_end(f"{prefix} epoch end")
    loop.metrics.epoch_end({**computed, "logger": {}}, step, None)
    call_hook(loop, f"on_{prefix}_epoch_end")
    late = results.epoch_end(f"on_{prefix}_epoch_end")
    results.reset_metric_objects()  # after the hook, so compute() in it gives the epoch value (as in Lightning)
    merged = {k: {**computed[k], **late[k]} for k in computed}
    epoch = loop.progress.current_epoch if loop.trainer.state.fn == TrainerFn.FITTING else None
    loop.metrics.epoch_end(merged, step, epoch)
    return {k: float(v) for k, v in merged["callback"].items()}


def _split_by_loader(metrics: Mapping[str, float], count: int) -> list[dict[str, float]]:
    if count <= 1:
        return [dict(metrics)] if count else []
    out: list[dict[str, float]] = [{} for _ in range(count)]
    for key, value in metrics.items():
        for idx in range(count):
            if key.endswith(f"/dataloader_idx_{idx}"):
                out[idx][key] = value
                break
        else:
            for part in out:
                part[key] = value
    return out


def run_predict(loop: FitState, return_predictions: bool = True) -> list[Any] | None:
    """Predict over every predict loader; returns predictions (a list per loader when several), on every rank
    those of all ranks in the data set's order; None with `return_predictions=False`."""
    module, mode, kept = loop.strategy.module, ModuleMode(), loop.predict_loop
    mode.enter(module, "predict")  # on_predict_model_eval
    loop.trainer.state.stage = RunningStage.PREDICTING
    call_hook(loop, "on_predict_start")
    call_hook(loop, "on_predict_epoch_start")
    loaders, limits = loop.loaders.predict, loop.loaders.predict_limits  # after the hooks (BatchSizeFinder)
    kept.start(loaders, return_predictions, loop.trainer.callbacks, loop.strategy.world_size)
    many = len(loaders) > 1
    with loop.strategy.evaluation_context(_inference_mode(loop)), loop.trainer.profiler.action("run_predict"):
        for dl_idx, (loader, limit) in enumerate(zip(loaders, limits, strict=True)):
            extra = (dl_idx,) if many else ()
            for batch_idx, batch, _ in data.iterate(loader, limit):
                kept.batch_fetched(dl_idx, batch_idx)  # the batch's dataset indices, for prediction writers
                batch = loop.to_device(batch, dl_idx)
                call_hook(loop, "on_predict_batch_start", batch, batch_idx, *extra)
                out = loop.run_step("predict_step", batch, batch_idx, *extra)
                call_hook(loop, "on_predict_batch_end", out, batch, batch_idx, *extra)
                kept.add(dl_idx, out)
    call_hook(loop, "on_predict_epoch_end")
    kept.end()
    call_hook(loop, "on_predict_end")
    mode.leave(module, "predict")
    return kept.result(loop.strategy)  # every rank's predictions in the data set's order (trainer/predictions.py)


def _inference_mode(loop: FitState) -> bool:
    """Lightning's rule: validate/test/predict follow the `inference_mode` flag; validation inside fit runs in
    no_grad (tensors made under inference_mode cannot be used by the training that follows)."""
    return loop.spec.inference_mode and loop.trainer.state.fn != TrainerFn.FITTING
