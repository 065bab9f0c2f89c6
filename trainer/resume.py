"""Bit-exact resume: what a checkpoint records about where each rank is inside the fit loop, and
how the next training epoch picks up from exactly there.

The order of a resumed epoch is replayed through the sampler (the consumed indices are skipped;
no batch is loaded and discarded). RNG is restored in the same order the uninterrupted run used
it: the epoch-start torch RNG before the loader's iterator is created (so worker seeds match),
then this rank's RNG at the moment of the save, after any fast-forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from strategies.distributed import rank_zero_warn
from strategies.exceptions import CheckpointLoadError
from trainer.sampling import resumable_sampler
from trainer.seed import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer


@dataclass
class ResumePoint:
    """Where this rank stopped, consumed by the first training epoch after a restore."""

    rng: dict[str, Any] | None
    mid_epoch: bool
    batches_done: int = 0
    epoch_start_rng: Tensor | None = None
    sampler_state: dict[str, Any] | None = None
    grads: dict[str, Tensor] | None = None
    window_has_loss: bool = False


def capture_loop_state(trainer: Trainer) -> dict[str, Any]:
    """This rank's part of the checkpoint: RNG now, RNG at epoch start, sampler order, open gradients."""
    sampler = resumable_sampler(trainer._loaders.train)
    state: dict[str, Any] = {
        "rng": capture_rng_state(),
        "epoch_start_rng": trainer._epoch_start_rng,
        "sampler": dict(sampler.epoch_state) if sampler is not None else {},
        "window_has_loss": trainer._window_has_loss,
        "results": trainer._train_results.state_dict(),
    }
    if trainer._window_has_loss:  # inside a gradient-accumulation window: the partial sum is state too
        grads = trainer.strategy.accumulated_gradients()
        if grads is None:
            rank_zero_warn(
                f"checkpoint taken inside a gradient-accumulation window with {type(trainer.strategy).__name__}, "
                "which cannot read the partial gradient sum: a resume from it restarts that window's gradients "
                "from zero (not bit-exact). Save at optimizer-step boundaries (e.g. every_n_train_steps)."
            )
            state["window_has_loss"] = False
        else:
            state["grads"] = grads
    return state


def plan_resume(trainer: Trainer, per_rank: list[dict[str, Any]], path: Any) -> ResumePoint:
    """Pick this rank's loop state from a checkpoint and check it fits this run's topology."""
    progress = trainer._progress
    mid_epoch = not progress.epoch_finished and progress.epoch_batches > 0
    rank, saved_world = trainer.global_rank, len(per_rank)
    if saved_world != trainer.world_size:
        if mid_epoch:
            raise CheckpointLoadError(
                f"{path} was saved mid-epoch by {saved_world} rank(s); this run has {trainer.world_size}. The data "
                "order of an unfinished epoch depends on the world size: resume with the same number of processes, "
                "or from a checkpoint taken at an epoch end."
            )
        rank_zero_warn(f"{path} was saved by {saved_world} rank(s), this run has {trainer.world_size}: per-rank RNG "
                       "states are not restored.")
        return ResumePoint(rng=None, mid_epoch=False)
    mine = per_rank[rank]
    trainer._train_results.load_state_dict(mine.get("results", {}))
    sampler = resumable_sampler(trainer._loaders.train)
    if sampler is not None:
        sampler.keep_run_seed(mine.get("sampler") or {})
    return ResumePoint(rng=mine.get("rng"), mid_epoch=mid_epoch, batches_done=progress.epoch_batches,
                       epoch_start_rng=mine.get("epoch_start_rng"), sampler_state=mine.get("sampler") or {},
                       grads=mine.get("grads"), window_has_loss=bool(mine.get("window_has_loss")))


def before_epoch(trainer: Trainer) -> None:
    """At an epoch boundary resume, restore RNG before anything of the new epoch runs."""
    point = trainer._resume_point
    if point is not None and not point.mid_epoch:
        trainer._resume_point = None
        if point.rng is not None:
            restore_rng_state(point.rng)


def open_epoch(trainer: Trainer, loader: Any) -> tuple[Any, int]:
    """Create the epoch's batch iterator; after a mid-epoch restore, positioned after the consumed batches.

    Returns (iterator, index of the first batch it yields).
    """
    point = trainer._resume_point
    if point is None or not point.mid_epoch:
        trainer._epoch_start_rng = torch.get_rng_state()
        return iter(loader), 0
    trainer._resume_point = None
    if point.epoch_start_rng is not None:
        torch.set_rng_state(point.epoch_start_rng)
    trainer._epoch_start_rng = torch.get_rng_state()
    sampler = resumable_sampler(loader)
    batch_size = getattr(loader, "batch_size", None)
    if sampler is not None and batch_size:
        sampler.replay(point.sampler_state or {}, skip=point.batches_done * batch_size)
        iterator = iter(loader)
    else:
        rank_zero_warn(
            f"this training loader cannot replay its order through the sampler ({type(loader).__name__}); "
            f"skipping {point.batches_done} batches by reading them. Resume may not be bit-exact."
        )
        iterator = iter(loader)
        for _ in range(point.batches_done):
            next(iterator, None)
    if point.rng is not None:
        restore_rng_state(point.rng)
    if point.grads:
        for name, param in trainer.strategy.module.named_parameters():
            if name in point.grads:
                param.grad = point.grads[name].to(param.device, param.dtype)
    trainer._window_has_loss = point.window_has_loss
    return iterator, point.batches_done
