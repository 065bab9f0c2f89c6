"""Bringing a run's outcome back to the launching process when the ranks ran elsewhere (ddp_spawn).

With spawn, the Trainer and model the user holds are copies that never trained; rank 0 sends back
the return value, the weights, the loop progress, the metrics and the callback states, and the
launching process adopts them, so `model` and `trainer` look the same as after an in-process fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState


@dataclass
class RankZeroResult:
    result: Any
    module_state: dict[str, torch.Tensor]
    progress: dict[str, Any]
    callback_metrics: dict[str, torch.Tensor]
    logged_metrics: dict[str, Any]
    callback_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    logger_versions: list[Any] = field(default_factory=list)
    status: str = "finished"

    def adopt_into(self, loop: FitState, model: Any) -> Any:
        """In the launching process: take over what rank 0 sent back; return the run's result."""
        from trainer.state import TrainerStatus

        trainer = loop.trainer
        if model is not None:
            model.load_state_dict(self.module_state)
            loop.module, model.trainer = model, trainer
        loop.progress.load_state_dict(self.progress)
        loop.metrics.adopt(self.callback_metrics, self.logged_metrics)
        for cb in trainer.callbacks:
            if cb.state_key in self.callback_states:
                cb.load_state_dict(self.callback_states[cb.state_key])
        for logger, identity in zip(trainer.loggers, self.logger_versions, strict=False):
            logger.adopt_identity(identity)  # log_dir names the folder (or run) the ranks wrote, not a fresh one
        trainer.state.status = TrainerStatus(self.status)
        return self.result


@dataclass
class LocalResult:
    """The run happened in the launching process: its Trainer and model already hold everything."""

    result: Any

    def adopt_into(self, loop: FitState, model: Any) -> Any:
        return self.result


def pack_if_child(loop: FitState, result: Any) -> LocalResult | RankZeroResult | None:
    """In the launching process: the plain result. In a spawned rank: a RankZeroResult (or None off rank 0,
    whose return value the spawn launcher drops)."""
    if os.getpid() == loop.launcher_pid:
        return LocalResult(result)
    if not loop.strategy.is_global_zero:
        return None
    module, trainer = loop.module, loop.trainer
    return RankZeroResult(
        result=result,
        module_state={k: v.detach().cpu() for k, v in module.state_dict().items()} if module is not None else {},
        progress=loop.progress.state_dict(),
        callback_metrics={k: v.detach().cpu() for k, v in loop.metrics.callback_metrics.items()},
        logged_metrics=loop.metrics.logged_metrics,
        callback_states={cb.state_key: cb.state_dict() for cb in trainer.callbacks},
        logger_versions=[logger.identity() for logger in trainer.loggers],
        status=trainer.state.status.value,
    )
