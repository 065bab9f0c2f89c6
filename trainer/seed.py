"""Seeding and RNG-state capture, so runs are reproducible and resumable."""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from strategies.comm.distributed import rank_zero_info, rank_zero_warn

SEED_ENV = "TRAINER_GLOBAL_SEED"
SEED_WORKERS_ENV = "TRAINER_SEED_WORKERS"  # "1" after seed_everything(workers=True); launched ranks inherit it
_MAX_SEED = 2**32 - 1


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed python, numpy (if installed) and torch (CPU and CUDA); return the seed used.

    With no seed, reuse TRAINER_GLOBAL_SEED from the environment (set for launched ranks) or pick 0.
    `workers=True` also seeds the DataLoader workers of the Trainer's loaders (see `seed_worker`): distinct per
    worker and rank, reproducible from the seed.
    """
    if seed is None:
        seed = int(os.environ.get(SEED_ENV, 0))
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an int in [0, {_MAX_SEED}], got {seed!r}")
    os.environ[SEED_ENV] = str(seed)
    os.environ[SEED_WORKERS_ENV] = str(int(workers))
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


def seed_workers_of(loader: Any, global_rank: int) -> None:
    """After `seed_everything(workers=True)`, give `loader` the worker seeding unless it has its own `worker_init_fn`.

    Set on the loader object as Lightning does (a `DataLoader` reads `worker_init_fn` when it starts its workers);
    a loader without the attribute (any iterable) is left alone.
    """
    if os.environ.get(SEED_WORKERS_ENV) == "1" and getattr(loader, "worker_init_fn", False) is None:
        loader.worker_init_fn = functools.partial(seed_worker, rank=global_rank)


def seed_worker(worker_id: int, rank: int = 0) -> None:
    """DataLoader `worker_init_fn`: seed torch, python and numpy from the base seed, the worker id and the rank.

    The same rule as Lightning's `pl_worker_init_function`, so a ported script draws the same numbers in its
    workers. torch gives worker `w` the seed `base + w`, where the loader draws `base` from the main process's
    RNG (or its `generator`) for every epoch's iterator: reproducible under `seed_everything`, different per
    epoch. Mixing in the rank keeps two ranks' worker `w` apart, which torch alone does not (same base seed).
    """
    base = torch.initial_seed() - worker_id
    torch_seed, python_high, python_low = _worker_seeds(base, worker_id, rank)[:3]
    torch.manual_seed(torch_seed)
    random.seed((python_high << 32) | python_low)
    try:
        import numpy as np

        np.random.seed(np.random.SeedSequence([base, worker_id, rank]).generate_state(4))
    except ImportError:
        pass


_MASK64 = (1 << 64) - 1


def _worker_seeds(base: int, worker_id: int, rank: int, count: int = 4) -> list[int]:
    """`count` 64-bit seeds: base, worker and rank packed into one number, scrambled with MurmurHash3's 64-bit
    finalizer (so small base seeds still set every bit), then successive states of Knuth's MMIX linear
    congruential generator."""
    state = (base << 32) | (worker_id << 16) | rank
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        state ^= state >> 33
        state = (state * multiplier) & _MASK64
    state ^= state >> 33
    seeds = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1) & _MASK64
        seeds.append(state)
    return seeds


def enable_determinism(enabled: bool | str) -> None:
    """Apply `Trainer(deterministic=...)`: True, False or "warn" (warn instead of failing)."""
    if enabled is None or enabled is False:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=enabled == "warn")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    rank_zero_info("Deterministic algorithms enabled (torch.use_deterministic_algorithms).")


def apply_cudnn_benchmark(benchmark: bool | None, deterministic: bool | str | None) -> None:
    """Apply `Trainer(benchmark=...)` after `deterministic`, as Lightning does: True or False set
    `torch.backends.cudnn.benchmark`; None leaves it as the session has it (deterministic runs turn it off)."""
    if benchmark and deterministic:
        rank_zero_warn("benchmark=True with deterministic=True: cuDNN then chooses its algorithms by timing them, and "
                       "torch does not keep cudnn.deterministic in that mode. Drop one of the two.")
    if benchmark is not None:
        torch.backends.cudnn.benchmark = benchmark


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


@contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Run a block without moving the global random generators: python's, numpy's and torch's (and CUDA's unless
    `include_cuda=False`, e.g. in a forked process that must not touch CUDA) are put back as they were on exit."""
    state = capture_rng_state()
    if not include_cuda:
        state.pop("cuda", None)
    try:
        yield
    finally:
        restore_rng_state(state)


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]
