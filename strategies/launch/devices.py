"""Accelerator + devices flags → a list of torch.device. No Accelerator class hierarchy needed."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from strategies.exceptions import ConfigError

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
CPU_RANKS_PER_CORE = 4  # more CPU ranks than this per usable core need ALLOW_MANY_CPU_RANKS=1 (a few are fine)
ALLOW_MANY_CPU_RANKS = "TRAINER_ALLOW_MANY_CPU_RANKS"


@dataclass(frozen=True)
class Hardware:
    """What this machine has. Passed in (rather than read inside) so flag resolution is a pure function."""

    cuda_device_count: int
    mps_available: bool
    cpu_count: int | None = None  # usable CPU cores; None: this process's affinity, read when needed

    @classmethod
    def detect(cls) -> Hardware:
        backend = getattr(torch.backends, "mps", None)
        return cls(torch.cuda.device_count() if torch.cuda.is_available() else 0,
                   bool(backend and backend.is_available()))


def resolve_accelerator(accelerator: str, hw: Hardware | None = None) -> str:
    """Return the torch device type ('cpu' | 'cuda' | 'mps') for an `accelerator=` flag."""
    hw = hw or Hardware.detect()
    if not isinstance(accelerator, str) or accelerator.lower() not in ACCELERATORS:
        raise ConfigError(f"accelerator={accelerator!r} is not supported. Accepted values: {', '.join(ACCELERATORS)}.")
    name = accelerator.lower()
    if name == "auto":
        if hw.cuda_device_count:
            return "cuda"
        return "mps" if hw.mps_available else "cpu"
    if name == "cpu":
        return "cpu"
    if name in ("gpu", "cuda"):
        if hw.cuda_device_count:
            return "cuda"
        if name == "gpu" and hw.mps_available:
            return "mps"
        raise ConfigError(
            f"accelerator={accelerator!r} (or gpus=N) needs a CUDA GPU, but torch.cuda.is_available() is False. "
            "To run N processes on CPU use accelerator='cpu', devices=N; or install a CUDA build of torch "
            "on a machine with a GPU."
        )
    if not hw.mps_available:
        raise ConfigError("accelerator='mps' needs Apple's MPS backend, which this machine lacks. Use 'cpu' or 'auto'.")
    return "mps"


def resolve_devices(
    device_type: str, devices: int | str | list[int] | tuple[int, ...], hw: Hardware | None = None
) -> list[torch.device]:
    """Return the local devices this process group uses, one entry per local rank.

    `devices` is an int (how many), a list of indices, "auto" (all GPUs, or one CPU process),
    a string like "2" or "0,1", or -1 (all GPUs).
    """
    hw = hw or Hardware.detect()
    cuda_count = hw.cuda_device_count
    if isinstance(devices, str):
        if devices.strip().lower() == "auto":
            return _indices_to_devices(device_type, list(range(cuda_count if device_type == "cuda" else 1)))
        devices = _parse_devices_text(devices)
    if isinstance(devices, bool):
        raise ConfigError(f"devices={devices!r} is not valid; use an int >= 1, a list of indices or 'auto'.")
    if isinstance(devices, int):
        count = _device_count(devices, device_type, cuda_count)
        _check_cpu_ranks(count, device_type, hw)
        return _indices_to_devices(device_type, list(range(count)))
    if isinstance(devices, (list, tuple)) and devices and all(isinstance(i, int) and i >= 0 for i in devices):
        if device_type == "cuda" and max(devices) >= cuda_count:
            raise ConfigError(f"devices={list(devices)[:8]} names a CUDA index that does not exist.")
        _check_cpu_ranks(len(devices), device_type, hw)
        return _indices_to_devices(device_type, list(devices))
    raise ConfigError(f"devices={devices!r} is not valid. Use an int >= 1, a list of indices, '0,1' or 'auto'.")


def _parse_devices_text(text: str) -> int | list[int]:
    """'2' → 2, '0,1' → [0, 1] (the command line and YAML spell devices as text)."""
    try:
        return [int(p) for p in text.split(",") if p.strip()] if "," in text else int(text.strip())
    except ValueError:
        raise ConfigError(
            f"devices={text!r} is not understood. Use an int >= 1, a list of indices, '0,1' or 'auto'."
        ) from None


def _device_count(count: int, device_type: str, cuda_count: int) -> int:
    """How many devices `devices=count` asks for, checked against what this machine has (-1: all GPUs)."""
    if count == -1 and device_type == "cuda":
        count = cuda_count
    if count < 1:
        raise ConfigError(
            f"devices={count} is not valid: it must be an int >= 1 (how many devices), a list of device "
            "indices, or 'auto'" + (" (-1 means all GPUs)." if device_type == "cuda" else ".")
        )
    if device_type == "cuda" and count > cuda_count:
        raise ConfigError(f"devices={count} but only {cuda_count} CUDA device(s) are visible.")
    if device_type == "mps" and count > 1:
        raise ConfigError("devices > 1 is not supported on MPS (there is one Apple GPU).")
    return count


def usable_cpus() -> int:
    """The CPU cores this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _check_cpu_ranks(count: int, device_type: str, hw: Hardware) -> None:
    """Each CPU device is one rank process (about 400 MB each, with torch): far more of them than cores is a typo
    that takes the machine's memory, unless asked for explicitly."""
    if device_type != "cpu":
        return
    cores = hw.cpu_count or usable_cpus()
    limit = CPU_RANKS_PER_CORE * cores
    if count > limit and os.environ.get(ALLOW_MANY_CPU_RANKS) != "1":
        raise ConfigError(
            f"devices={count} on CPU would start {count} rank processes on {cores} usable CPU core(s), more than "
            f"{CPU_RANKS_PER_CORE} per core ({limit}); each takes a few hundred MB. Pass a smaller devices=, or set "
            f"{ALLOW_MANY_CPU_RANKS}=1 to start them anyway."
        )


def _indices_to_devices(device_type: str, indices: list[int]) -> list[torch.device]:
    if device_type == "cuda":
        return [torch.device("cuda", i) for i in indices]
    return [torch.device(device_type) for _ in indices]
