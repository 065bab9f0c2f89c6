"""Fit the tiny transformer of tests/helpers/tensor_parallel.py under ModelParallelStrategy and write rank 0's whole
weights; run by tests/strategies/test_model_parallel.py on CUDA (NCCL), where ranks are processes of our launcher.

    python tests/scripts/model_parallel_fit.py --out OUT --accelerator gpu --devices 4 --data-parallel 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `python tests/scripts/...` puts only tests/scripts/ on the path
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from strategies import ModelParallelStrategy  # noqa: E402
from tests.helpers.tensor_parallel import TinyTransformer, full_state, loader  # noqa: E402
from trainer import Trainer, seed_everything  # noqa: E402

GLOBAL_BATCH, STEPS, CLIP = 8, 6, 0.1


def fit(strategy: object, accelerator: str, devices: int, batch_size: int) -> tuple[TinyTransformer, Trainer]:
    """The parity run: seeded, SGD with momentum, gradient clipping, the same global batches for every mesh."""
    seed_everything(0)
    model = TinyTransformer(optimizer="sgd")
    trainer = Trainer(accelerator=accelerator, devices=devices, strategy=strategy, max_steps=STEPS,
                      gradient_clip_val=CLIP, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(model, loader(batch_size))
    return model, trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--data-parallel", type=int, default=2)
    args = parser.parse_args()
    dp = args.data_parallel
    model, trainer = fit(ModelParallelStrategy(data_parallel_size=dp), args.accelerator, args.devices,
                         GLOBAL_BATCH // dp)
    weights = {k: v.cpu() for k, v in full_state(model).items()}  # collective: every rank gathers
    if trainer.is_global_zero:
        torch.save({"weights": weights, "backend": trainer.strategy.process_group_backend},
                   Path(args.out) / "weights.pt")


if __name__ == "__main__":
    main()
