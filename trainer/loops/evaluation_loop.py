"""The loops that do not train: validate and test (`run_evaluation`, also called by fit) and predict. Flat and blind
to the strategy type, as the fit loop."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainer.data import loaders as data
from trainer.hooks import call_hook
from trainer.loops.model_mode import ModuleMode
from trainer.setup.step_signature import check_dataloader_idx
from trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState

_PREFIX = {RunningStage.VALIDATING: "validation", RunningStage.SANITY_CHECKING: "validation",
           RunningStage.TESTING: "test"}
_FETCH = {"validation": "val", "test": "test"}  # Lightning's fetch action names: `[_EvaluationLoop].val_next`
_EVAL_ACTION = {RunningStage.VALIDATING: "run_validation", RunningStage.SANITY_CHECKING: "run_sanity_check",
                RunningStage.TESTING: "run_test"}  # profiler action names


def run_evaluation(loop: FitState, stage: RunningStage) -> list[dict[str, float]]:
    """Validation, sanity check or test over every eval loader; returns one metrics dict per loader.

    As Lightning's, all of it (the loaders' request and the hooks included) runs under `torch.inference_mode` (or
    `no_grad`), and a stage whose loaders hold no batch runs no hook at all.
    """
    state, sanity = loop.trainer.state, stage == RunningStage.SANITY_CHECKING
    previous_stage, state.stage = state.stage, stage
    try:
        with loop.strategy.evaluation_context(_inference_mode(loop)):
            if sanity:
                call_hook(loop, "on_sanity_check_start")
            loop.request_eval(stage)
            metrics = _evaluate(loop, stage) if any(loop.eval_loaders(stage)[1]) else None
            if sanity:
                call_hook(loop, "on_sanity_check_end")
    finally:
        state.stage = previous_stage
    return metrics or []


def _evaluate(loop: FitState, stage: RunningStage) -> list[dict[str, float]]:
    s, prefix = loop.strategy, _PREFIX[stage]
    module, mode = s.module, ModuleMode()
    loaders = loop.eval_loaders(stage)[0]
    for loader in loaders:  # as Lightning, at every evaluation: the epoch the fit is at (or ended with)
        data.set_epoch(loader, loop.progress.current_epoch)
    check_dataloader_idx(module, f"{prefix}_step", (f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"),
                         len(loaders) > 1)
    with loop.using_results(loop.new_eval_results()) as results:
        mode.enter(module, prefix, loop.trainer.profiler)  # on_{validation,test}_model_eval
        call_hook(loop, f"on_{prefix}_start")
        call_hook(loop, f"on_{prefix}_epoch_start")
        loaders, limits = loop.eval_loaders(stage)  # after the start hooks: BatchSizeFinder may rebuild them
        many = len(loaders) > 1  # read one after another (a non-sequential CombinedLoader is one stream)
        seen = None if stage == RunningStage.SANITY_CHECKING else \
            loop.loaders.batches_seen("test" if stage == RunningStage.TESTING else "val", len(loaders))
        with loop.trainer.profiler.action(_EVAL_ACTION[stage]):
            for dl_idx, (loader, limit) in enumerate(zip(loaders, limits, strict=True)):
                results.key_suffix = f"/dataloader_idx_{dl_idx}" if many else ""
                results.dataloader_idx = dl_idx if many else None
                _evaluate_loader(loop, results, loader, limit, prefix, dl_idx, many, seen)
        results.key_suffix, results.dataloader_idx = "", None
        metrics = _eval_epoch_end(loop, results, stage, prefix)
        if stage == RunningStage.VALIDATING:
            loop.position.validation_finished()  # a checkpoint from on_validation_end on counts it as done
        call_hook(loop, f"on_{prefix}_end")
        mode.leave(module, prefix, loop.trainer.profiler)  # on_{validation,test}_model_train, or the modes from before
    return _split_by_loader(metrics, len(loaders), results.output_loaders)


def _evaluate_loader(loop: FitState, results: Any, loader: Any, limit: int | float, prefix: str, dl_idx: int,
                     many: bool, seen: list[int] | None) -> None:
    """One evaluation loader. Its shards may hold different numbers of batches on different ranks (no padding, or
    no length): from the first step some rank may lack, every step is a round that every rank joins
    (`reduce_eval_step`, before and after the batch-end hook), so a per-step sync_dist value never leaves a rank
    waiting; a rank that has run out joins the remaining rounds with nothing to add. After each batch its step
    values go to the loggers, at the count of this loader's batches `seen` (None: the sanity check logs nothing)."""
    control, extra = loop.control, (dl_idx,) if many else ()
    counts = control.eval_batch_counts(limit)  # None: the same known count on every rank (or one process)
    joined_from = math.inf if counts is None else max(min(counts), 0)  # counts known and different: the fewest
    more = counts is not None  # whether this rank must join the round at joined_from (or after its last step)
    fetched = data.timed_fetches(loader, loop.trainer.profiler, f"[_EvaluationLoop].{_FETCH[prefix]}_next")
    for batch_idx, batch, is_last in data.iterate(fetched, limit):
        results.defer_eval_sync = joined = batch_idx >= joined_from
        batch = loop.to_device(batch, dl_idx)
        results.set_batch(batch)
        call_hook(loop, f"on_{prefix}_batch_start", batch, batch_idx, *extra)
        out = loop.run_step(f"{prefix}_step", batch, batch_idx, *extra)
        if joined:  # reduced before the batch-end hook reads it, as a value reduced in self.log would be
            control.reduce_eval_step(results)
        call_hook(loop, f"on_{prefix}_batch_end", out, batch, batch_idx, *extra)
        if joined:
            more = control.reduce_eval_step(results, more=not is_last)
        if seen is not None:
            loop.metrics.eval_step_end(results, seen[dl_idx])
            seen[dl_idx] += 1
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
    loop.metrics.epoch_end(merged, step, loop.progress.current_epoch)  # `epoch` in validate/test too, as Lightning
    return {k: float(v) for k, v in merged["logger"].items()}  # what validate/test return: the logged epoch values


def _split_by_loader(metrics: Mapping[str, float], count: int,
                     loaders: Mapping[str, int | None]) -> list[dict[str, float]]:
    """One dict per loader, as Lightning's results: each value in the dict of the loader it was logged for (with or
    without its `/dataloader_idx_N`), values logged outside any loader (in the epoch-end hook) in all of them."""
    if count <= 1:
        return [dict(metrics)] if count else []
    out: list[dict[str, float]] = [{} for _ in range(count)]
    for key, value in metrics.items():
        idx = loaders.get(key)
        for part in out if idx is None else [out[idx]]:
            part[key] = value
    return out


def run_predict(loop: FitState, return_predictions: bool = True) -> list[Any] | None:
    """Predict over every predict loader; returns predictions (a list per loader when several), on every rank
    those of all ranks in the data set's order; None with `return_predictions=False` or when the loaders hold no
    batch (then no hook runs, as in Lightning). All of it runs under `torch.inference_mode` (or `no_grad`)."""
    loop.trainer.state.stage = RunningStage.PREDICTING
    with loop.strategy.evaluation_context(_inference_mode(loop)):
        loop.request_eval(RunningStage.PREDICTING)
        if not any(loop.loaders.predict_limits):
            return None
        return _predict(loop, return_predictions)


def _predict(loop: FitState, return_predictions: bool) -> list[Any] | None:
    module, mode, kept = loop.strategy.module, ModuleMode(), loop.predict_loop
    for loader in loop.loaders.predict:
        data.set_epoch(loader, loop.progress.current_epoch)
    check_dataloader_idx(module, "predict_step", ("on_predict_batch_start", "on_predict_batch_end"),
                         len(loop.loaders.predict) > 1)
    mode.enter(module, "predict", loop.trainer.profiler)  # on_predict_model_eval
    call_hook(loop, "on_predict_start")
    call_hook(loop, "on_predict_epoch_start")
    loaders, limits = loop.loaders.predict, loop.loaders.predict_limits  # after the hooks (BatchSizeFinder)
    kept.start(loaders, return_predictions, loop.trainer.callbacks, loop.strategy.world_size)
    many = len(loaders) > 1
    with loop.trainer.profiler.action("run_predict"):
        for dl_idx, (loader, limit) in enumerate(zip(loaders, limits, strict=True)):
            extra = (dl_idx,) if many else ()
            fetched = data.timed_fetches(loader, loop.trainer.profiler, "[_PredictionLoop].predict_next")
            for batch_idx, batch, _ in data.iterate(fetched, limit):
                kept.batch_fetched(dl_idx, batch_idx)  # the batch's dataset indices, for prediction writers
                batch = loop.to_device(batch, dl_idx)
                call_hook(loop, "on_predict_batch_start", batch, batch_idx, *extra)
                out = loop.run_step("predict_step", batch, batch_idx, *extra)
                call_hook(loop, "on_predict_batch_end", out, batch, batch_idx, *extra)
                kept.add(dl_idx, out)
    call_hook(loop, "on_predict_epoch_end")
    kept.end()
    call_hook(loop, "on_predict_end")
    mode.leave(module, "predict", loop.trainer.profiler)
    return kept.result(loop.strategy)  # every rank's predictions in the data set's order (trainer/loops/predictions.py)


def _inference_mode(loop: FitState) -> bool:
    """Lightning's rule: validate/test/predict follow the `inference_mode` flag; validation inside fit runs in
    no_grad (tensors made under inference_mode cannot be used by the training that follows)."""
    return loop.spec.inference_mode and loop.trainer.state.fn != TrainerFn.FITTING
