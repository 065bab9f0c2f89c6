"""How many batches a loader gives: its length (inf without one) and `limit_*_batches` applied to it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sized

from strategies.exceptions import ConfigError

_LIMIT_FLAGS = {"train": "limit_train_batches", "val": "limit_val_batches", "test": "limit_test_batches",
                "predict": "limit_predict_batches"}


def loader_length(loader: Iterable) -> int | float:
    """Number of batches, or inf when the loader has no length."""
    try:
        return len(loader) if isinstance(loader, Sized) else math.inf
    except (TypeError, NotImplementedError):  # a DataLoader over an IterableDataset without a length, or a __len__
        return math.inf                       # that says it has none (Lightning's rule)


def limit_batches(stage: str, length: int | float, limit: int | float) -> int | float:
    """Apply limit_*_batches: an int caps the count; a float is a fraction of the length."""
    if isinstance(limit, int):
        return min(length, limit)
    if limit == 1.0:
        return length
    if length == math.inf:
        raise ConfigError(
            f"{_LIMIT_FLAGS[stage]}={limit} is a fraction, but the {stage} loader has no length; pass an int instead."
        )
    count = int(length * limit)
    return max(count, 1) if limit > 0 and length > 0 else count
