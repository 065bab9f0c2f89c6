"""Bit-exact resume: what a checkpoint records about where each rank is inside the fit loop, and
how the next training epoch picks up from exactly there.

The order of a resumed epoch is replayed through the sampler (the consumed indices are skipped;
no batch is loaded and discarded). RNG is restored in the same order the uninterrupted run used
it: the epoch-start torch RNG and loader generators before the loader's iterator is created (so
the permutation and worker seeds match), then this rank's RNG at the saved position, after any
fast-forward. Which position a checkpoint records is decided in trainer.checkpoint.loop_position.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import CheckpointLoadError
from trainer.checkpoint.loop_position import Phase, rng_after, saved_progress, window_after
from trainer.data import loaders as data
from trainer.data.sampling import resumable_sampler
from trainer.loops.automatic_optimization import RestoredGradients, step_window
from trainer.seed import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState


@dataclass
class ResumePoint:
    """Where this rank stopped, consumed by the first training epoch after a restore."""

    rng: dict[str, Any] | None
    mid_epoch: bool
    batches_done: int = 0
    epoch_start_rng: Tensor | None = None
    sampler_state: dict[str, Any] | None = None
    generators: list[Tensor] | None = None  # loader generator states at the save (epoch-boundary resume)
    grads: dict[str, Tensor] | None = None
    window_has_loss: bool = False
    step_pending: bool = False


@dataclass
class SavedPosition:
    """The parts of a checkpoint that describe the loop position; metrics and callbacks only when frozen."""

    progress: dict[str, Any]
    loop: dict[str, Any]  # this rank's part (gathered from every rank by the checkpoint)
    metrics: dict[str, Any] | None = None
    callbacks: dict[str, Any] | None = None


def checkpoint_position(loop: FitState) -> SavedPosition:
    """What a checkpoint taken now records: the live position, or the one frozen when an epoch was left early."""
    stopped = loop.position.stopped
    if stopped is not None:
        return SavedPosition(stopped["progress"], dict(stopped["loop"]), stopped["metrics"], stopped["callbacks"])
    return SavedPosition(saved_progress(loop.position, loop.progress.state_dict()), _loop_state(loop))


def _loop_state(loop: FitState) -> dict[str, Any]:
    """This rank's part: RNG, epoch start, data order, open gradients, epoch accumulators."""
    position = loop.position
    rolled_back = position.phase is Phase.BATCH_STARTED
    sampler = resumable_sampler(loop.loaders.train)
    sampler_state = sampler.epoch_state if sampler is not None else {}
    window_has_loss, step_pending = window_after(position, loop.window_has_loss)
    state: dict[str, Any] = {
        "rng": rng_after(position, capture_rng_state()),
        "epoch_start_rng": position.epoch_start_rng,
        "sampler": dict(position.batch_start.get("sampler", sampler_state) if rolled_back else sampler_state),
        "generators": sampler.generator_states() if sampler is not None else [],
        "window_has_loss": window_has_loss,
        "step_pending": step_pending,
        "results": loop.train_results.state_dict(before_batch=rolled_back),
        "loaders_requested_at": dict(loop.loaders.requested_at),  # reload_dataloaders_every_n_epochs goes on
        "data_shard": loop.strategy.distributed_sampler_kwargs,  # how the data was split (a device mesh may
        # split it fewer ways than there are ranks)
    }
    if window_has_loss:  # inside a gradient-accumulation window: the partial sum is state too
        grads = loop.strategy.accumulated_gradients()
        if grads is None:
            rank_zero_warn(
                f"checkpoint taken inside a gradient-accumulation window (or before its optimizer step) with "
                f"{type(loop.strategy).__name__}, "
                "which cannot read the partial gradient sum: a resume from it restarts that window's gradients "
                "from zero (not bit-exact). Save at optimizer-step boundaries (e.g. every_n_train_steps)."
            )
            state["window_has_loss"] = state["step_pending"] = False
        else:
            precision, opt = loop.strategy.precision, loop.optimizers[0] if loop.optimizers else None
            state["grads"] = precision.gradients_as_backward_left_them(opt, grads) if step_pending and opt else grads
    return state


def freeze_at_stop(loop: FitState) -> None:
    """The loop leaves an epoch before its end because the fit stops: until training goes on, checkpoints
    record this position, not the epoch end that follows (a resume continues the epoch here)."""
    saved = checkpoint_position(loop)
    loop.position.stopped = copy.deepcopy({
        "progress": saved.progress,
        "loop": saved.loop,
        "metrics": loop.metrics.state_dict(),
        "callbacks": {cb.state_key: state for cb in loop.trainer.callbacks if (state := cb.state_dict())},
    })


def plan_resume(loop: FitState, per_rank: list[dict[str, Any]], path: Any) -> ResumePoint:
    """Pick this rank's loop state from a checkpoint and check it fits this run's topology."""
    progress = loop.progress
    mid_epoch = progress.epoch_opened and not progress.epoch_finished
    rank, world = loop.strategy.global_rank, loop.strategy.world_size
    change = _topology_change(per_rank, loop.strategy.distributed_sampler_kwargs, rank, world)
    if change is not None:
        if mid_epoch and loop.schedule.limit_reached() is None:  # with nothing left to train, order is moot
            raise CheckpointLoadError(
                f"{path} was saved mid-epoch {change}. The data order of an unfinished epoch depends on how the "
                "data is split over the ranks: resume with the same processes (and device mesh), or from a "
                "checkpoint taken at an epoch end."
            )
        rank_zero_warn(f"{path} was saved {change}: per-rank RNG states are not restored.")
        return ResumePoint(rng=None, mid_epoch=False)
    mine = per_rank[rank]
    loop.train_results.load_state_dict(mine.get("results", {}))
    loop.loaders.resumed(mine.get("loaders_requested_at", {}))
    sampler = resumable_sampler(loop.loaders.train)
    if sampler is not None:
        sampler.keep_run_seed(mine.get("sampler") or {})
    return ResumePoint(rng=mine.get("rng"), mid_epoch=mid_epoch, batches_done=progress.epoch_batches,
                       epoch_start_rng=mine.get("epoch_start_rng"), sampler_state=mine.get("sampler") or {},
                       generators=mine.get("generators"), grads=mine.get("grads"),
                       window_has_loss=bool(mine.get("window_has_loss")), step_pending=bool(mine.get("step_pending")))


def _topology_change(per_rank: list[dict[str, Any]], shard_now: dict[str, Any] | None, rank: int,
                     world: int) -> str | None:
    """How the checkpoint's ranks differ from this run's (in words), or None when they match: the world size, or,
    at the same world size, how the data is split (the data-parallel size of a device mesh)."""
    if len(per_rank) != world:
        return f"by {len(per_rank)} rank(s), this run has {world}"
    saved = per_rank[rank].get("data_shard", shard_now)  # older checkpoints do not record it
    if saved != shard_now:
        ways = [shard.get("num_replicas", 1) if shard else 1 for shard in (saved, shard_now)]
        return f"with the data split {ways[0]} way(s) over {world} rank(s), this run splits it {ways[1]} way(s)"
    return None


def before_epoch(loop: FitState) -> None:
    """At an epoch-boundary resume, restore RNG and loader generators before anything of the new epoch runs."""
    loop.position.reset()  # training goes on: a position frozen at a stop no longer holds
    point = loop.resume_point
    if point is not None and not point.mid_epoch:
        loop.resume_point = None
        if point.rng is not None:
            restore_rng_state(point.rng)
        sampler = resumable_sampler(loop.loaders.train)
        if sampler is not None and point.generators:
            sampler.set_generator_states(point.generators)


def open_epoch(loop: FitState, loader: Any) -> tuple[Any, int]:
    """Create the epoch's batch iterator; after a mid-epoch restore, positioned after the consumed batches.

    Returns (iterator, index of the first batch it yields).
    """
    position, point = loop.position, loop.resume_point
    sampler = resumable_sampler(loader)
    loop.progress.epoch_opened = True
    if point is None or not point.mid_epoch:
        position.epoch_start_rng = torch.get_rng_state()
        if sampler is not None:
            sampler.begin_epoch()
        return iter(loader), 0
    loop.resume_point = None
    if point.epoch_start_rng is not None:
        torch.set_rng_state(point.epoch_start_rng)
    position.epoch_start_rng = torch.get_rng_state()
    iterator = _replay(loader, sampler, point)
    if point.rng is not None:
        restore_rng_state(point.rng)
    if point.grads:
        for name, param in loop.strategy.module.named_parameters():
            if name in point.grads:
                param.grad = point.grads[name].to(param.device, param.dtype)
    loop.window_has_loss = point.window_has_loss
    if point.step_pending:  # saved between this window's last backward and its optimizer step
        loop.strategy.precision.prepare_resumed_step(loop.optimizers[0])
        step_window(loop, point.batches_done - 1, RestoredGradients())
        position.phase = Phase.BETWEEN_BATCHES
    if point.batches_done == loop.schedule.num_training_batches and data.runs_out(loader, point.batches_done):
        data.run_out(iterator)  # the epoch's batches were all read: finish the iterator as the loop did
    return iterator, point.batches_done


def _replay(loader: Any, sampler: Any, point: ResumePoint) -> Any:
    if getattr(sampler, "replays_by_state", False):  # the loader restores its own position (trainer/data/sampling.py)
        sampler.begin_epoch(point.sampler_state)
        return iter(loader)
    if getattr(sampler, "replays_by_reading", False):  # several loaders read together (trainer/data/sampling.py)
        sampler.begin_epoch(point.sampler_state)
        iterator = iter(loader)
        for _ in range(point.batches_done):
            next(iterator, None)
        return iterator
    batch_size = getattr(loader, "batch_size", None)
    if sampler is not None and batch_size:
        sampler.begin_epoch(point.sampler_state, skip=point.batches_done * batch_size)
        return iter(loader)
    rank_zero_warn(
        f"this training loader cannot replay its order through the sampler ({type(loader).__name__}); "
        f"skipping {point.batches_done} batches by reading them. Resume may not be bit-exact."
    )
    iterator = iter(loader)
    for _ in range(point.batches_done):
        next(iterator, None)
    return iterator
