"""Strategies: everything that differs between one device, DataParallel, DDP, ZeRO and tensor parallelism.

This package is a leaf: it imports torch only, never `trainer` or `callbacks`. Lightning's names under
`lightning.pytorch.strategies` and `.plugins` resolve here too (strategies/from_lightning.py), or name what to use.
"""


from strategies.base import Strategy
from strategies.comm.distributed import rank_zero_only
from strategies.ddp import DDPStrategy
from strategies.dp import DataParallelStrategy
from strategies.from_lightning import package_lookups
from strategies.model_parallel import ModelParallelStrategy
from strategies.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision, precision_from_flag
from strategies.registry import STRATEGY_REGISTRY
from strategies.single_device import SingleDeviceStrategy
from strategies.zero import ZeroStrategy

__all__ = [
    "DDPStrategy",
    "DataParallelStrategy",
    "DoublePrecision",
    "HalfPrecision",
    "MixedPrecision",
    "ModelParallelStrategy",
    "STRATEGY_REGISTRY",
    "Precision",
    "SingleDeviceStrategy",
    "Strategy",
    "ZeroStrategy",
    "precision_from_flag",
    "rank_zero_only",
]


# Lightning's names (docs/from-lightning.md): resolved on first use, or an error naming what to use instead
__getattr__, __dir__ = package_lookups(__name__, "strategies.from_lightning")
