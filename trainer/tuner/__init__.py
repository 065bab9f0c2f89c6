"""`Tuner(trainer)`: Lightning's tuner entry point (`lightning.pytorch.tuner.Tuner`)."""

from typing import Any

from trainer.tuner.tuning import Tuner

__all__ = ["Tuner"]


def __getattr__(name: str) -> Any:
    """Lightning's names (trainer/from_lightning.py): resolved on first use, or an error naming what to use."""
    from strategies.from_lightning import resolve
    from trainer.from_lightning import TABLES

    value = resolve(__name__, TABLES[__name__], name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    from strategies.from_lightning import names_here
    from trainer.from_lightning import TABLES

    return sorted({*globals(), *names_here(TABLES[__name__])})
