"""`isinstance` against a class without importing its module to answer it.

No object can be an instance of a class whose module was never imported, so asking "is any of these a
ModelCheckpoint?" need not import `callbacks.checkpoint` (and what it imports) when nothing did: the answer is no.
A Trainer without the default callbacks then loads none of their modules (time to first step is a benchmark; see
docs/benchmarks.md). The same reasoning as `strategies.model.compiled.unwrap_compiled`, which does not import dynamo.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def loaded_class(module: str, name: str) -> type | None:
    """The class `module.name` when `module` is imported already, else None (nothing is imported)."""
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) else None


def instances_of(items: Iterable[Any], module: str, name: str) -> list[Any]:
    """The items that are instances of `module.name`, in order; none when that module was never imported."""
    kind = loaded_class(module, name)
    return [] if kind is None else [item for item in items if isinstance(item, kind)]
