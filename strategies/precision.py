"""The Precision object: owns autocast, input/parameter casting, backward, the optimizer step and
the loss scaler's state, so that every strategy gets precision handling without knowing its kind.

`precision_from_flag` is the one alias table for the Trainer's `precision=` flag.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from strategies.exceptions import ConfigError

# Every spelling users write, mapped to its canonical name (Lightning 2.x names).
_ALIASES: dict[str | int, str] = {
    "32-true": "32-true", "32": "32-true", 32: "32-true",
    "64-true": "64-true", "64": "64-true", 64: "64-true",
    "16-mixed": "16-mixed", "16": "16-mixed", 16: "16-mixed",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "bf16-true": "bf16-true", "16-true": "16-true",
}
CANONICAL_PRECISIONS = ("32-true", "64-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true")


def canonical_precision(flag: str | int) -> str:
    """Map any accepted spelling of the precision flag to its canonical name, or raise ConfigError."""
    key = flag.strip().lower() if isinstance(flag, str) else flag
    if isinstance(key, bool) or key not in _ALIASES:
        accepted = ", ".join(repr(a) for a in _ALIASES)
        raise ConfigError(f"precision={flag!r} is not a known precision. Accepted values: {accepted}.")
    return _ALIASES[key]


class Precision:
    """'32-true': full float32, no autocast. Subclasses override only what differs."""

    name: ClassVar[str] = "32-true"
    param_dtype: torch.dtype | None = None

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast parameters for *-true precisions; identity here."""
        return module

    def forward_context(self) -> AbstractContextManager:
        """Entered around every step inside the step router (autocast for *-mixed)."""
        return nullcontext()

    def convert_input(self, batch: Any) -> Any:
        """Cast floating-point inputs for *-true precisions; identity here."""
        return batch

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling before gradients are read (clipping); nothing to undo here."""

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None) -> bool:
        """Step the optimizer; return False when the step was skipped (so schedulers do not step)."""
        optimizer.step(closure) if closure is not None else optimizer.step()
        return True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore for full precision."""


_IMPLEMENTED: dict[str, type[Precision]] = {"32-true": Precision}


def precision_from_flag(flag: str | int) -> Precision:
    """Build the Precision object for a `precision=` flag value."""
    name = canonical_precision(flag)
    if name not in _IMPLEMENTED:
        raise ConfigError(
            f"precision={flag!r} ({name}) is not available in this release; "
            f"available: {', '.join(sorted(_IMPLEMENTED))}."
        )
    return _IMPLEMENTED[name]()
