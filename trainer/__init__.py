"""trainer: a small PyTorch training framework in the style of PyTorch Lightning.

Public names only. Heavy optional dependencies (tensorboard, omegaconf, tqdm, torchmetrics) are
imported by the components that need them, when they are first used.
"""

from typing import Any

from strategies.comm.distributed import rank_zero_debug, rank_zero_info, rank_zero_only, rank_zero_warn
from trainer.banner import cli_lightning_logo
from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule
from trainer.data.combined_loader import CombinedLoader
from trainer.seed import seed_everything
from trainer.trainer import Trainer

__all__ = [
    "CombinedLoader",
    "DataModule",
    "TrainModule",
    "Trainer",
    "cli_lightning_logo",
    "rank_zero_debug",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "seed_everything",
]
__version__ = "0.1.0"


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
