"""WeightAveraging and EMAWeightAveraging: Lightning 2.6's averaging callbacks on torch's `AveragedModel`.

Why a view instead of averaging the module itself: `AveragedModel(module)` deep-copies the whole module, which
FSDP2 refuses ("FSDP does not support deepcopy") and which would also copy everything the module refers to. The
callback hands `AveragedModel` a `_TensorView`, a module that registers the live parameters and buffers under index
names, so `AveragedModel` copies only tensors. Under zero2/zero3 those are DTensors, and so are their copies: the
average of a sharded model stays sharded, and each rank averages its own shards.

The copy is built at the start of fit (or when a checkpoint is restored), after the strategy has placed and wrapped
the module, because a sharding strategy replaces the parameters when it wraps. Checkpoints follow Lightning's
layout: `state_dict` holds the averaged weights (what `load_from_checkpoint` gives a user), `current_model_state`
the weights being trained, `averaging_state` the `AveragedModel`'s own state (`n_averaged`). Both weight sets go
through the strategy's `module_state_dict`/`load_module_state_dict`, so they are full-state dicts under every
strategy.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class _TensorView(nn.Module):
    """The live parameters and buffers of a module, registered again under index names (no copies)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        for index, param in enumerate(module.parameters()):
            self.register_parameter(f"p{index}", param)
        for index, buffer in enumerate(module.buffers()):
            self.register_buffer(f"b{index}", buffer)


def _tensors(module: nn.Module) -> Iterator[Tensor]:
    return itertools.chain(module.parameters(), module.buffers())


class WeightAveraging(Callback):
    """Keeps an average of the weights (SWA by default, or any `avg_fn`/`multi_avg_fn` of torch's `AveragedModel`).

    The average is updated after every optimizer step for which `should_update(step_idx=...)` is true, and at the
    end of every training epoch for which `should_update(epoch_idx=...)` is true (the default: every step, never at
    epoch end). Validation during fit runs on the averaged weights; when training ends, the module keeps them.

    Args:
        device: where the averaged copy lives (default: beside the module's own tensors); `"cpu"` saves device memory.
        use_buffers: average the buffers too (default, unlike `AveragedModel`); False copies them as they are.
        **kwargs: passed to `torch.optim.swa_utils.AveragedModel`, e.g. `avg_fn` or `multi_avg_fn`.

    Example:
        ```python
        from torch.optim.swa_utils import get_ema_multi_avg_fn

        trainer = Trainer(max_epochs=3, callbacks=[WeightAveraging(multi_avg_fn=get_ema_multi_avg_fn(0.99))])
        ```
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._live: _TensorView | None = None  # the module's own tensors, as AveragedModel reads them
        self._fitting = False
        # Lightning's counters: global_step when the average was last updated (so an accumulation window's batches
        # update it once) and the last epoch it was updated at (-1: none yet).
        self._latest_update_step = 0
        self._latest_update_epoch = -1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average after optimizer step `step_idx` or epoch `epoch_idx` (both zero-based;
        exactly one is given). Override to choose; the default is after every step."""
        return step_idx is not None

    # --- building the copy -----------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._fitting = stage == "fit"
        if self._fitting and getattr(trainer.strategy, "sharded_checkpoint", False):
            raise ConfigError(
                f"{type(self).__name__} cannot save its averaged weights into a sharded checkpoint folder "
                "(sharded_checkpoint=True). Use the strategy's default full-state checkpoints."
            )

    def _averaged(self, pl_module: TrainModule) -> AveragedModel:
        if self._average_model is None:
            self._live = _TensorView(pl_module)
            self._average_model = AveragedModel(self._live, device=self._device, use_buffers=self._use_buffers,
                                                **self._kwargs)
        return self._average_model

    def _update(self, pl_module: TrainModule) -> None:
        average = self._averaged(pl_module)
        assert self._live is not None
        average.update_parameters(self._live)

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._averaged(pl_module)

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._fitting = False

    # --- updates -----------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._update(pl_module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._update(pl_module)
            self._latest_update_epoch = epoch

    # --- which weights the module holds -------------------------------------------------------------------
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._average_model is not None:
            self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._average_model is not None:
            self._swap(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        with torch.no_grad():
            for average, current in zip(_tensors(self._averaged(pl_module).module), _tensors(pl_module),
                                        strict=True):
                current.copy_(average)

    def _swap(self, pl_module: nn.Module) -> None:
        assert self._average_model is not None
        with torch.no_grad():
            for average, current in zip(_tensors(self._average_model.module), _tensors(pl_module), strict=True):
                held = average.clone()
                average.copy_(current)
                current.copy_(held)

    # --- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step, "latest_update_epoch": self._latest_update_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]
        self._latest_update_epoch = state_dict.get("latest_update_epoch", -1)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        if self._average_model is None or not self._fitting:
            rank_zero_info(f"{type(self).__name__}: a checkpoint saved outside fit holds the module's weights only.")
            return
        strategy = trainer.strategy
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        self._swap(pl_module)  # the strategy's own state-dict path gives the averaged weights their saved form
        try:
            # copies: a state dict may share storage with the module, which gets the trained weights back below
            checkpoint["state_dict"] = {name: value.detach().clone() if isinstance(value, Tensor) else value
                                        for name, value in strategy.module_state_dict().items()}
        finally:
            self._swap(pl_module)
        checkpoint["averaging_state"] = {"n_averaged": self._average_model.n_averaged.detach().clone()}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        average = self._averaged(pl_module)
        strategy = trainer.strategy
        if "current_model_state" not in checkpoint or "averaging_state" not in checkpoint:
            rank_zero_warn(f"The checkpoint was not saved with {type(self).__name__}: the average starts from its "
                           "weights.")
            self._copy_into_average(pl_module, average)
            return
        # The strategy loaded `state_dict` (the average) into the module: keep it as the average, then restore
        # the weights being trained.
        self._copy_into_average(pl_module, average)
        average.n_averaged.copy_(checkpoint["averaging_state"]["n_averaged"])
        strategy.load_module_state_dict(checkpoint["current_model_state"])

    @staticmethod
    def _copy_into_average(pl_module: nn.Module, average: AveragedModel) -> None:
        with torch.no_grad():
            for held, current in zip(_tensors(average.module), _tensors(pl_module), strict=True):
                held.copy_(current)


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights, `decay` per update (Lightning 2.6's `EMAWeightAveraging`).

    Updates after every `update_every_n_steps`-th optimizer step from `update_starting_at_step` on, and after every
    epoch from `update_starting_at_epoch` on when that is given.

    Example:
        ```python
        trainer = Trainer(max_epochs=3, callbacks=[EMAWeightAveraging(decay=0.99)])
        ```
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 decay: float = 0.999, update_every_n_steps: int = 1, update_starting_at_step: int | None = None,
                 update_starting_at_epoch: int | None = None, **kwargs: Any) -> None:
        super().__init__(device=device, use_buffers=use_buffers, avg_fn=get_ema_avg_fn(decay=decay), **kwargs)
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None and self._step_due(step_idx):
            return True
        return epoch_idx is not None and self.update_starting_at_epoch is not None \
            and epoch_idx >= self.update_starting_at_epoch

    def _step_due(self, step_idx: int) -> bool:
        started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
        return started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0
