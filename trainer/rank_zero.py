"""The rank-zero helpers under the module name Lightning users import them from
(`lightning.pytorch.utilities.rank_zero` → `trainer.rank_zero`); `from trainer import rank_zero_info` works too."""

from strategies.comm.distributed import rank_zero_debug, rank_zero_info, rank_zero_only, rank_zero_warn

__all__ = ["rank_zero_debug", "rank_zero_info", "rank_zero_only", "rank_zero_warn"]
