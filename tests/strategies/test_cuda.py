"""On a CUDA machine: DDP over NCCL (one rank) with its gloo control group, ZeRO-2/3 with bf16, fp16 loss scaling,
and the same weights as one plain device. Skipped without CUDA; run them wherever a GPU is lent."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.runif import run_if
from trainer import Trainer, seed_everything

pytestmark = run_if(min_cuda_gpus=1)


@pytest.fixture(autouse=True)
def _end_process_group():
    """DDP keeps its process group for later calls in the same script; these in-process runs end it."""
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
GPU = {**{k: v for k, v in QUIET.items() if k not in ("accelerator", "devices")}, "accelerator": "gpu", "devices": 1}


class LogsSynced(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss, sync_dist=True, on_epoch=True)
        return loss


def _fit(strategy: str, precision: str = "32-true", **flags: Any) -> tuple[Trainer, dict[str, torch.Tensor]]:
    seed_everything(0)
    model = LogsSynced()
    trainer = Trainer(strategy=strategy, precision=precision, max_epochs=2, **{**GPU, **flags})
    trainer.fit(model)
    return trainer, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


@pytest.mark.timeout(120)
def test_ddp_on_nccl_matches_one_device_and_agrees_over_gloo():
    single_trainer, single = _fit("single")
    trainer, ddp = _fit("ddp")
    assert trainer.strategy.process_group_backend == "nccl"
    assert torch.distributed.get_backend(trainer.strategy._control_group) == "gloo"
    assert trainer.global_step == single_trainer.global_step == 16
    for key in single:
        torch.testing.assert_close(ddp[key], single[key], rtol=1e-5, atol=1e-6)
    assert "loss_epoch" in trainer.callback_metrics


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_zero_stages_train_on_cuda_in_bf16_mixed(strategy: str):
    trainer, weights = _fit(strategy, "bf16-mixed")
    assert trainer.global_step == 16
    assert all(torch.isfinite(v).all() for v in weights.values())


@pytest.mark.timeout(120)
def test_16_mixed_on_cuda_scales_the_loss_and_trains():
    trainer, weights = _fit("single", "16-mixed")
    scaler_state = trainer.strategy.precision.state_dict()
    assert scaler_state, "no GradScaler state under 16-mixed on CUDA"
    assert trainer.global_step > 0 and all(torch.isfinite(v).all() for v in weights.values())


@pytest.mark.timeout(120)
def test_terminate_on_nan_on_cuda_names_the_step():
    from trainer.ranks.agreement import NonFiniteLossError

    class NanAtStep3(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if self.global_step == 3 else loss

    trainer = Trainer(strategy="ddp", terminate_on_nan=True, max_epochs=1, **GPU)
    with pytest.raises(NonFiniteLossError, match="rank 0 is .* at global step 3"):
        trainer.fit(NanAtStep3())
