"""What `TrainModule.optimizers()` hands out, and what `optimizer_step` receives: the user's optimizer, whose
`.step(closure)` goes through the strategy (precision, loss scaling, ZeRO) and the Trainer's step hooks.

Why a dynamic subclass: user code checks `isinstance(opt, torch.optim.Optimizer)` or `isinstance(opt, Adam)`, so
the wrapper's class derives from the class of the optimizer the user built (one class per optimizer class,
cached). Reads go to the wrapped optimizer (the one the strategy stepping it holds, e.g. ZeRO-1's sharded one);
writes of attributes the wrapper does not own go there too, so the two never drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.optim import Optimizer

from strategies.exceptions import MisconfigurationError

if TYPE_CHECKING:
    from strategies.base import Strategy

_OWN = frozenset({"_optimizer", "_strategy", "_after_closure", "_after_step"})


class StrategyOptimizer:
    """The wrapper's behaviour; `wrap_optimizer` mixes it into a subclass of the user's optimizer class.

    `step(closure)` runs `closure` (training_step and backward, or whatever the user passes), then
    `after_closure(optimizer)` (the on_before_optimizer_step hook and clipping), then the optimizer's own step
    through the strategy; `after_step(optimizer, stepped)` tells the Trainer it happened. Everything else
    (param_groups, state, zero_grad, state_dict, ...) is the wrapped optimizer's own.

    `StrategyOptimizer(optimizer)` alone (Lightning's `LightningOptimizer(optimizer)`) also builds the subclass of the
    optimizer's class; without a strategy, `step` is the optimizer's own step (no Trainer, so no hooks to run).
    """

    def __new__(cls, optimizer: Optimizer, *args: Any, **kwargs: Any) -> StrategyOptimizer:
        if cls is StrategyOptimizer:  # built by hand: an instance of the optimizer's class too, as wrap_optimizer's
            cls = _wrapper_class(type(optimizer))
        return object.__new__(cls)

    def __init__(self, optimizer: Optimizer, strategy: Strategy | None = None,
                 after_closure: Callable[[Optimizer], None] | None = None,
                 after_step: Callable[[Optimizer, bool], None] | None = None) -> None:
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_strategy", strategy)
        object.__setattr__(self, "_after_closure", after_closure)
        object.__setattr__(self, "_after_step", after_step)

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped optimizer, as the strategy set it up."""
        return self._optimizer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """One optimizer step through the strategy; returns what the closure returned (its first call), if any."""
        optimizer = self._optimizer
        if self._strategy is None or self._after_closure is None or self._after_step is None:
            return optimizer.step(closure, **kwargs)  # built by hand, outside a Trainer
        if closure is None:
            self._after_closure(optimizer)
            stepped = self._strategy.optimizer_step(optimizer, None, **kwargs)
            self._after_step(optimizer, stepped)
            return None
        if not callable(closure):
            raise MisconfigurationError(
                f"optimizer.step(closure) needs a callable closure, got {type(closure).__name__}."
            )
        results: list[Any] = []

        def closure_then_hooks() -> Any:
            result = closure()
            results.append(result)
            self._after_closure(optimizer)
            return result

        stepped = self._strategy.optimizer_step(optimizer, closure_then_hooks, **kwargs)
        self._after_step(optimizer, stepped)
        return results[0] if results else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._optimizer.add_param_group(param_group)

    def __getattr__(self, name: str) -> Any:  # only for names not found on the instance or its classes
        if name in _OWN:  # not set yet (e.g. during copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._optimizer!r})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The class is built at run time; pickling (ddp_spawn, deepcopy) rebuilds it from the user's class.
        return wrap_optimizer, (self._optimizer, self._strategy, self._after_closure, self._after_step,
                                type(self).__bases__[1])


_CLASSES: dict[type, type] = {}


def wrap_optimizer(optimizer: Optimizer, strategy: Strategy, after_closure: Callable[[Optimizer], None],
                   after_step: Callable[[Optimizer, bool], None], user_class: type | None = None) -> StrategyOptimizer:
    """Wrap `optimizer` (as the strategy set it up) in an instance of a subclass of `user_class`, the class of
    the optimizer `configure_optimizers` returned (default: `optimizer`'s own class)."""
    return _wrapper_class(user_class or type(optimizer))(optimizer, strategy, after_closure, after_step)


def _wrapper_class(base: type) -> type[StrategyOptimizer]:
    """The subclass of StrategyOptimizer and `base` (one per optimizer class, cached)."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(f"Strategy{base.__name__}", (StrategyOptimizer, base), {})
    return cls


def unwrap_optimizer(optimizer: Any) -> Optimizer:
    """The torch optimizer behind what `TrainModule.optimizers()` handed out (GradScaler keys state by it)."""
    return optimizer.optimizer if isinstance(optimizer, StrategyOptimizer) else optimizer
