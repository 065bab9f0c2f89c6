"""trainer: a small PyTorch training framework in the style of PyTorch Lightning.

Public names only. Heavy optional dependencies (tensorboard, omegaconf, tqdm, torchmetrics) are
imported by the components that need them, when they are first used.
"""


from strategies.comm.distributed import rank_zero_debug, rank_zero_info, rank_zero_only, rank_zero_warn
from strategies.from_lightning import package_lookups
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


# Lightning's names (docs/from-lightning.md): resolved on first use, or an error naming what to use instead
__getattr__, __dir__ = package_lookups(__name__, "trainer.from_lightning")
