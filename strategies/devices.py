"""Accelerator + devices flags → a list of torch.device. No Accelerator class hierarchy needed."""

from __future__ import annotations

import torch

from strategies.exceptions import ConfigError

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def resolve_accelerator(accelerator: str) -> str:
    """Return the torch device type ('cpu' | 'cuda' | 'mps') for an `accelerator=` flag."""
    if not isinstance(accelerator, str) or accelerator.lower() not in ACCELERATORS:
        raise ConfigError(f"accelerator={accelerator!r} is not supported. Accepted values: {', '.join(ACCELERATORS)}.")
    name = accelerator.lower()
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if name in ("gpu", "cuda"):
        if torch.cuda.is_available():
            return "cuda"
        if name == "gpu" and _mps_available():
            return "mps"
        raise ConfigError(
            f"accelerator={accelerator!r} needs a CUDA GPU, but torch.cuda.is_available() is False. "
            "Use accelerator='cpu' (or 'auto'), or install a CUDA build of torch on a machine with a GPU."
        )
    if not _mps_available():
        raise ConfigError("accelerator='mps' needs Apple's MPS backend, which this machine lacks. Use 'cpu' or 'auto'.")
    return "mps"


def _device_count(device_type: str) -> int:
    if device_type == "cuda":
        return torch.cuda.device_count()
    return 1 if device_type == "mps" else 1


def resolve_devices(device_type: str, devices: int | str | list[int] | tuple[int, ...]) -> list[torch.device]:
    """Return the local devices this process group uses, one entry per local rank.

    `devices` is an int (how many), a list of indices, "auto" (all GPUs, or one CPU process),
    a string like "2" or "0,1", or -1 (all GPUs).
    """
    if isinstance(devices, str):
        text = devices.strip().lower()
        if text == "auto":
            count = _device_count(device_type) if device_type == "cuda" else 1
            return _indices_to_devices(device_type, list(range(count)))
        try:
            devices = [int(p) for p in text.split(",") if p.strip()] if "," in text else int(text)
        except ValueError:
            raise ConfigError(
                f"devices={devices!r} is not understood. Use an int >= 1, a list of indices, '0,1' or 'auto'."
            ) from None
    if isinstance(devices, bool):
        raise ConfigError(f"devices={devices!r} is not valid; use an int >= 1, a list of indices or 'auto'.")
    if isinstance(devices, int):
        if devices == -1 and device_type == "cuda":
            devices = _device_count("cuda")
        if devices < 1:
            raise ConfigError(
                f"devices={devices} is not valid: it must be an int >= 1 (how many devices), a list of device "
                "indices, or 'auto'" + (" (-1 means all GPUs)." if device_type == "cuda" else ".")
            )
        if device_type == "cuda" and devices > _device_count("cuda"):
            raise ConfigError(f"devices={devices} but only {_device_count('cuda')} CUDA device(s) are visible.")
        if device_type == "mps" and devices > 1:
            raise ConfigError("devices > 1 is not supported on MPS (there is one Apple GPU).")
        return _indices_to_devices(device_type, list(range(devices)))
    if isinstance(devices, (list, tuple)) and devices and all(isinstance(i, int) and i >= 0 for i in devices):
        if device_type == "cuda" and max(devices) >= _device_count("cuda"):
            raise ConfigError(f"devices={list(devices)} names a CUDA index that does not exist.")
        return _indices_to_devices(device_type, list(devices))
    raise ConfigError(f"devices={devices!r} is not valid. Use an int >= 1, a list of indices, '0,1' or 'auto'.")


def _indices_to_devices(device_type: str, indices: list[int]) -> list[torch.device]:
    if device_type == "cuda":
        return [torch.device("cuda", i) for i in indices]
    return [torch.device(device_type) for _ in indices]
