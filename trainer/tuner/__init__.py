"""`Tuner(trainer)`: Lightning's tuner entry point (`lightning.pytorch.tuner.Tuner`)."""

from strategies.from_lightning import package_lookups
from trainer.tuner.tuning import Tuner

__all__ = ["Tuner"]


# Lightning's names (docs/from-lightning.md): resolved on first use, or an error naming what to use instead
__getattr__, __dir__ = package_lookups(__name__, "trainer.from_lightning")
