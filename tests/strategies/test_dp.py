"""DataParallel needs CUDA: a clear error on CPU; on a GPU machine it trains like one device."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from strategies import DataParallelStrategy
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.runif import run_if
from trainer import Trainer
from trainer.exceptions import ConfigError


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_dp_without_cuda_names_the_cpu_alternative():
    with pytest.raises(ConfigError, match=r"needs CUDA GPUs.*strategy='ddp' with accelerator='cpu', devices=N"):
        DataParallelStrategy()


class LogsFromReplicas(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss, on_epoch=True)
        return loss


@run_if(min_cuda_gpus=1)
def test_dp_trains_and_logs_on_gpus():
    trainer = Trainer(accelerator="gpu", devices=torch.cuda.device_count(), strategy="dp", max_epochs=1,
                      **{k: v for k, v in QUIET.items() if k not in ("accelerator", "devices")})
    model = LogsFromReplicas()
    trainer.fit(model)
    assert trainer.global_step == 8 and "loss_epoch" in trainer.callback_metrics
    assert next(model.parameters()).device.type == "cuda"
