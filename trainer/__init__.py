"""trainer: a small PyTorch training framework in the style of PyTorch Lightning.

Public names only. Heavy optional dependencies (tensorboard, omegaconf, tqdm, torchmetrics) are
imported by the components that need them, when they are first used.
"""

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
