"""The process-global state a spawned rank takes over from the process that launched it.

A rank started by `torch.multiprocessing` spawn is a fresh interpreter: without this, its random generators start
from fresh seeds and its determinism switches from their defaults, whatever the launching script set before `fit()`.
Lightning's spawn launcher carries the RNG states of python, numpy and torch (CPU and CUDA), torch's deterministic
algorithms flag and cuDNN's benchmark flag into every rank, so `torch.manual_seed(0)` before `fit` makes every rank
draw the same numbers run after run. A forked rank inherits all of this with the process image and needs none of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class GlobalState:
    """What `capture` read in the launching process; `restore` sets it in a rank (every rank gets the same)."""

    deterministic: bool
    deterministic_warn_only: bool
    cudnn_benchmark: bool
    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor]
    python_rng: Any
    numpy_rng: Any

    @classmethod
    def capture(cls) -> GlobalState:
        return cls(
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            torch_rng=torch.get_rng_state(),
            # only a process that already set CUDA up has CUDA generator states worth carrying (and reading them
            # would set CUDA up here, which a later fork of this process cannot survive)
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
            python_rng=random.getstate(),
            numpy_rng=_numpy_state(),
        )

    def restore(self) -> None:
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.deterministic_warn_only)
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        if self.numpy_rng is not None:
            import numpy as np

            np.random.set_state(self.numpy_rng)


def _numpy_state() -> Any:
    try:
        import numpy as np
    except ImportError:
        return None
    return np.random.get_state()
