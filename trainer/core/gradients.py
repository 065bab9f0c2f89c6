"""What a module's hooks ask about its gradients: their norms (`grad_norm`, to log in `on_before_optimizer_step`) and
the two ways of clipping them (`GradClipAlgorithmType`, which `clip_gradients` accepts beside the plain strings)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trainer.state import LightningEnum


class GradClipAlgorithmType(LightningEnum):
    """`gradient_clip_algorithm`: "norm" clips the norm of all gradients together, "value" each value."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(value: str) -> bool:
        """Whether `value` names one of the algorithms (exact letter case)."""
        return value in GradClipAlgorithmType.supported_types()

    @staticmethod
    def supported_types() -> list[str]:
        return [member.value for member in GradClipAlgorithmType]


def grad_norm(module: nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict[str, Tensor]:
    """The p-norm of each parameter's gradient and of all of them together, keyed as Lightning keys them.

    Keys are `grad_{p}_norm{group_separator}{parameter name}` for each parameter that has a gradient, and
    `grad_{p}_norm_total` for the norm of every gradient taken as one vector, with `p = float(norm_type)` (so `2`
    gives `grad_2.0_norm/...`; `"inf"` the largest absolute value). No gradient yet: an empty dict.

    Example:
        ```python
        def on_before_optimizer_step(self, optimizer):
            self.log_dict(grad_norm(self, norm_type=2))
        ```
    """
    p = float(norm_type)
    if not p > 0:  # also refuses NaN
        raise ValueError(f"grad_norm(norm_type={norm_type!r}): use a positive number or 'inf'.")
    norms = {f"grad_{p}_norm{group_separator}{name}": param.grad.detach().norm(p)
             for name, param in module.named_parameters() if param.grad is not None}
    if norms:
        norms[f"grad_{p}_norm_total"] = torch.stack(list(norms.values())).norm(p)
    return norms
