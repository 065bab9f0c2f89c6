"""`Tuner(trainer)`: Lightning's tuner entry point (`lightning.pytorch.tuner.Tuner`)."""

from trainer.tuner.tuning import Tuner

__all__ = ["Tuner"]
