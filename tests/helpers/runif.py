"""`run_if(...)`: one marker factory for tests that need hardware or optional packages."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def run_if(min_cuda_gpus: int = 0, bf16_cuda: bool = False, package: str | None = None) -> pytest.MarkDecorator:
    """Skip unless the machine has `min_cuda_gpus` GPUs (bf16-capable if asked) and `package` imports."""
    reasons = []
    if min_cuda_gpus and torch.cuda.device_count() < min_cuda_gpus:
        reasons.append(f"needs {min_cuda_gpus} CUDA GPU(s)")
    if bf16_cuda and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        reasons.append("needs a bf16-capable CUDA GPU")
    if package and importlib.util.find_spec(package) is None:
        reasons.append(f"needs the package {package!r}")
    return pytest.mark.skipif(bool(reasons), reason=", ".join(reasons) or "requirements met")
