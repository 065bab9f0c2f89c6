"""Bit-exact resume with an overridden `optimizer_step` (a learning-rate warm-up): checkpoints taken inside the
closure (training_step, on_before_zero_grad, on_after_backward) and between the closure and the step
(on_before_optimizer_step, which a resume finishes by calling the override again on the restored gradients) continue
the uninterrupted run exactly, torch.equal (the resume matrix's helpers, tests/helpers/resume_runs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.resume_runs import (
    AFTER_VAL,
    MID,
    WINDOW,
    Net,
    batches_done,
    differences,
    fit,
    record,
    resume_and_compare,
    state_of,
)

SAVES = [("training_step", MID), ("on_before_zero_grad", AFTER_VAL), ("on_after_backward", WINDOW),
         ("on_before_optimizer_step", MID), ("on_train_batch_end", MID)]
DONE = {"training_step": MID - 1, "on_before_zero_grad": AFTER_VAL - 1, "on_after_backward": WINDOW,
        "on_before_optimizer_step": MID, "on_train_batch_end": MID}


class WarmUpNet(Net):
    """The resume matrix's network, with the warm-up of Lightning's docs in optimizer_step."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < 4:
            for group in optimizer.param_groups:
                group["lr"] = 0.02 * (self.trainer.global_step + 1) / 4


def test_resuming_inside_an_overridden_optimizer_step_is_bit_exact(tmp_path: Path):
    reference = state_of(*fit("dropout", tmp_path / "reference", model_cls=WarmUpNet))
    model, trainer, paths = record("dropout", tmp_path / "recording", hook_saves=SAVES, model_checkpoints=(),
                                   model_cls=WarmUpNet)
    assert differences(reference, state_of(model, trainer)) == []  # the saves change nothing
    for (hook, k), path in zip(SAVES, paths.values(), strict=True):
        assert batches_done(path) == DONE[hook], hook
        assert resume_and_compare("dropout", tmp_path / f"{hook}-{k}", path, reference, model_cls=WarmUpNet) == [], hook


def test_the_warm_up_changes_the_run(tmp_path: Path):
    """The comparison above can fail: without the override the run differs."""
    plain = state_of(*fit("dropout", tmp_path / "plain"))
    warm = state_of(*fit("dropout", tmp_path / "warm", model_cls=WarmUpNet))
    assert differences(warm, plain) != []
