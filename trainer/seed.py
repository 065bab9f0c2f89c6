"""Seeding and RNG-state capture, so runs are reproducible and resumable."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

from strategies.distributed import rank_zero_info

SEED_ENV = "TRAINER_GLOBAL_SEED"
_MAX_SEED = 2**32 - 1


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed python, numpy (if installed) and torch (CPU and CUDA); return the seed used.

    With no seed, reuse TRAINER_GLOBAL_SEED from the environment (set for launched ranks) or pick 0.
    `workers=True` also makes DataLoader workers derive distinct, reproducible seeds.
    """
    if seed is None:
        seed = int(os.environ.get(SEED_ENV, 0))
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an int in [0, {_MAX_SEED}], got {seed!r}")
    os.environ[SEED_ENV] = str(seed)
    os.environ["TRAINER_SEED_WORKERS"] = str(int(workers))
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    return seed


def seed_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: seed python and numpy from torch's per-worker seed."""
    worker_seed = torch.initial_seed() % 2**32
    random.seed(worker_seed)
    try:
        import numpy as np

        np.random.seed(worker_seed)
    except ImportError:
        pass


def enable_determinism(enabled: bool | str) -> None:
    """Apply `Trainer(deterministic=...)`: True, False or "warn" (warn instead of failing)."""
    if enabled is None or enabled is False:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=enabled == "warn")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    rank_zero_info("Deterministic algorithms enabled (torch.use_deterministic_algorithms).")


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and primitives (weights-only safe)."""
    state: dict[str, Any] = {"python": _python_state(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        # The dict form: the legacy tuple is typed as "tuple or dict" (a dict for non-MT19937 generators).
        np_state = np.random.get_state(legacy=False)
        mt = np_state["state"]
        state["numpy"] = {"kind": str(np_state["bit_generator"]), "keys": torch.from_numpy(mt["key"].astype("int64")),
                          "pos": int(mt["pos"]), "has_gauss": int(np_state["has_gauss"]),
                          "gauss": float(np_state["gauss"])}
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of capture_rng_state."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np

            s = state["numpy"]
            np.random.set_state((s["kind"], s["keys"].numpy().astype("uint32"), s["pos"], s["has_gauss"], s["gauss"]))
        except ImportError:
            pass
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]
