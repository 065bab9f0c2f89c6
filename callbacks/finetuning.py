"""BaseFinetuning and BackboneFinetuning: freeze layers before training, unfreeze them at an epoch start into a new
optimizer param group (Lightning 2.x's names, arguments and helpers).

Freezing happens in `setup`, before the strategy wraps the module and before `configure_optimizers`, so the
optimizer is built over the trainable parameters only. Unfreezing happens in `on_train_epoch_start`; the loop then
asks the strategy to adapt (`Strategy.sync_trainable_parameters`): DDP builds its gradient reducer from the
parameters that require grad, and is wrapped again so that the unfrozen layers' gradients are averaged across ranks
(under Lightning they are not: each rank would train its own copy of the backbone).

The param groups added after the first are saved by parameter name, so a resumed run adds them back (and makes
their parameters trainable again) before the optimizer state is loaded: the resume stays bit-exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)

Modules = nn.Module | Iterable[Any]


def multiplicative(epoch: int) -> float:
    """BackboneFinetuning's default `lambda_func`: double the backbone's learning rate every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Override `freeze_before_training(pl_module)` and `finetune_function(pl_module, epoch, optimizer)`.

    Build the optimizer over `filter(lambda p: p.requires_grad, self.parameters())` (or over the layers you keep
    trainable), then add the unfrozen layers with `unfreeze_and_add_param_group`.

    Example:
        ```python
        class UnfreezeAtEpoch(BaseFinetuning):
            def freeze_before_training(self, pl_module):
                self.freeze(pl_module.encoder)

            def finetune_function(self, pl_module, epoch, optimizer):
                if epoch == 2:
                    self.unfreeze_and_add_param_group(pl_module.encoder, optimizer, lr=1e-4)
        ```
    """

    def __init__(self) -> None:
        # optimizer index -> its param groups after the first ones, each with parameter names instead of tensors
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._groups_at_start: dict[int, int] = {}

    def freeze_before_training(self, pl_module: TrainModule) -> None:
        """Freeze what should not train at first (called in `setup`, before `configure_optimizers`)."""
        raise NotImplementedError(f"{type(self).__name__} must define freeze_before_training(pl_module)")

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: Optimizer) -> None:
        """Unfreeze layers at the start of epoch `epoch` (called once per optimizer)."""
        raise NotImplementedError(f"{type(self).__name__} must define finetune_function(pl_module, epoch, optimizer)")

    # --- Lightning's helpers ---------------------------------------------------------------------------------------
    @staticmethod
    def flatten_modules(modules: Modules) -> list[nn.Module]:
        """The leaf modules of `modules` (a module, a ModuleDict or nested iterables), and those holding parameters of
        their own."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, nn.Module):
            found: Iterable[nn.Module] = modules.modules()
        else:
            found = [leaf for item in modules for leaf in BaseFinetuning.flatten_modules(item)]
        return [m for m in found if not list(m.children()) or next(m.parameters(recurse=False), None) is not None]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Iterator[nn.Parameter]:
        """The parameters of `modules` whose `requires_grad` is `requires_grad` (BatchNorm's skipped unless
        `train_bn`)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze `modules` (BatchNorm layers track running statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        """Freeze one module's own parameters (a BatchNorm layer stops tracking running statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze `modules`; with `train_bn` their BatchNorm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """`params` without those the optimizer already has (with a warning naming the usual cause)."""
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in held]
        if len(kept) < len(params):
            rank_zero_warn(
                f"The provided params to be frozen already exist within another group of this optimizer: "
                f"{len(params) - len(kept)} of them are skipped. Did you init your optimizer in configure_optimizers "
                f"over the trainable parameters only, as {type(optimizer).__name__}(filter(lambda p: p.requires_grad, "
                "self.parameters()), ...)?"
            )
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(modules: Modules, optimizer: Optimizer, lr: float | None = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:
        """Unfreeze `modules` and add their parameters to `optimizer` as a new group, at `lr` or, without it, at the
        first group's learning rate divided by `initial_denom_lr`."""
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_on_optimizer(
            optimizer, BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True))
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    # --- hooks -----------------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self.freeze_before_training(pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            self._groups_at_start.setdefault(index, len(optimizer.param_groups))
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._record(pl_module, index, optimizer)

    def _record(self, pl_module: nn.Module, index: int, optimizer: Optimizer) -> None:
        names = {id(p): name for name, p in pl_module.named_parameters()}
        added = optimizer.param_groups[self._groups_at_start[index]:]
        self._internal_optimizer_metadata[index] = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
            for group in added
        ]

    # --- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata,
                "groups_at_start": self._groups_at_start}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._internal_optimizer_metadata = {int(k): v for k, v in state_dict["internal_optimizer_metadata"].items()}
        self._groups_at_start = {int(k): v for k, v in state_dict.get("groups_at_start", {}).items()}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Add the saved groups back (their parameters trainable again) before the optimizer state is loaded."""
        params = dict(pl_module.named_parameters())
        for index, optimizer in enumerate(trainer.optimizers):
            start = self._groups_at_start.setdefault(index, len(optimizer.param_groups))
            if len(optimizer.param_groups) != start:
                raise ConfigError(f"{type(self).__name__}: optimizer {index} has {len(optimizer.param_groups)} param "
                                  f"groups at the resume, {start} were expected (configure_optimizers changed?).")
            for group in self._internal_optimizer_metadata.get(index, []):
                restored = [params[name] for name in group["params"]]
                ids = {id(p) for p in restored}
                owners = [m for m in pl_module.modules() if any(id(p) in ids for p in m.parameters(recurse=False))]
                self.make_trainable(owners)
                optimizer.add_param_group({**group, "params": restored})


class BackboneFinetuning(BaseFinetuning):
    """Train `pl_module.backbone` from epoch `unfreeze_backbone_at_epoch` on, in its own param group whose learning
    rate starts at `backbone_initial_lr` (or the first group's times `backbone_initial_ratio_lr`) and is multiplied
    by `lambda_func(epoch + 1)` every later epoch, capped at the first group's rate when `should_align`.

    Example:
        ```python
        trainer = Trainer(callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=5)])
        ```
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable[[int], float] = multiplicative,
                 backbone_initial_ratio_lr: float = 10e-2, backbone_initial_lr: float | None = None,
                 should_align: bool = True, initial_denom_lr: float = 10.0, train_bn: bool = True,
                 verbose: bool = False, rounding: int = 12) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if not isinstance(getattr(pl_module, "backbone", None), nn.Module):
            raise ConfigError("BackboneFinetuning needs the module to have a `backbone` attribute that is an "
                              f"nn.Module; {type(pl_module).__name__} has none.")
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: TrainModule) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = self.backbone_initial_lr if self.backbone_initial_lr is not None \
                else current_lr * self.backbone_initial_ratio_lr
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, backbone_lr, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr
            optimizer.param_groups[-1]["lr"] = backbone_lr
        else:
            return
        self.previous_backbone_lr = backbone_lr
        if self.verbose:
            log.info(f"Current lr: {round(current_lr, self.rounding)}, "
                     f"Backbone lr: {round(backbone_lr, self.rounding)}")
