"""The resume matrix: every checkpoint source x stop point x data, on one device and under ddp on 2 ranks.

A cell resumes one checkpoint to the end, in a run seeded differently on purpose, and must equal the
uninterrupted run of its configuration: weights, optimizer state, scheduler state and the per-batch
loss series, torch.equal. The configuration, the stop points and how each checkpoint is made are in
tests/helpers/resume_runs.py; one reference and one recording run serve every cell of a configuration.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo  # noqa: F401 (DDP imports it on first use: once here, not in every forked rank)
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.resume_runs import (
    AFTER_FIT,
    AFTER_VAL,
    DATA,
    EPOCH_END,
    HOOK_SAVES,
    MID,
    MODEL_CHECKPOINTS,
    WINDOW,
    Net,
    batches_done,
    differences,
    end_fit,
    fit,
    record,
    resume_and_compare,
    state_of,
)

SOURCES = [
    *(f"{hook}@{k}" for hook, k in HOOK_SAVES),
    *(f"{folder}/{name}" for folder, names in MODEL_CHECKPOINTS.items() for name in names),
    *(f"after_fit:{how}" for how in AFTER_FIT),
]

# Where each source's checkpoint continues: the batches it counts as done (docs/checkpointing.md, the rules).
# A checkpoint taken before a batch's backward trains that batch again; from the backward on, after it.
EXPECTED_DONE = {
    **{f"{hook}@0": 0 for hook in ("on_fit_start", "on_sanity_check_end", "on_train_start", "on_train_epoch_start")},
    **{f"{hook}@{k}": k - 1 for hook in ("on_train_batch_start", "training_step", "on_before_backward")
       for k in (MID, WINDOW)},
    f"on_before_zero_grad@{AFTER_VAL}": AFTER_VAL - 1,  # before that batch's backward
    **{f"{hook}@{MID}": MID for hook in ("on_after_backward", "on_before_optimizer_step", "on_train_batch_end")},
    **{f"{hook}@{WINDOW}": WINDOW for hook in ("on_after_backward", "on_train_batch_end")},
    **{f"{hook}@{AFTER_VAL}": AFTER_VAL for hook in ("on_train_batch_end", "on_validation_start",
                                                     "on_validation_batch_end", "on_validation_epoch_end",
                                                     "on_validation_end")},
    **{f"{hook}@{EPOCH_END}": EPOCH_END for hook in ("on_train_batch_end", "on_validation_end", "on_train_epoch_end",
                                                     "on_train_epoch_start")},
    "every_n_train_steps/epoch=1-step=4": MID, "on_validation/epoch=1-step=4": AFTER_VAL,
    "on_validation/epoch=1-step=6": EPOCH_END, "every_n_epochs/epoch=1-step=6": EPOCH_END,
    "train_time_interval/epoch=0-step=1": 3, "save_last/last": 22,
    "after_fit:max_steps": MID, "after_fit:max_epochs": EPOCH_END, "after_fit:early_stopping": 4,
    "after_fit:should_stop": WINDOW, "after_fit:exception": WINDOW, "after_fit:sigterm": WINDOW + 1,
}


# Sources whose checkpoints hold the same content (all but the ModelCheckpoint states, which a resume without those
# callbacks does not read): a resume from one is the resume from the others, so the default run resumes the first of
# each group (23 distinct checkpoints of 38 sources) and test_a_group_saves_one_checkpoint proves the others equal.
# The sanity check's differs from on_fit_start's by the validation loaders it requested; the training loaders are
# requested before on_train_start, so its checkpoint is on_train_epoch_start's.
# (Batch numbers as in tests/helpers/resume_runs.py: MID 11, AFTER_VAL 12, WINDOW 13, EPOCH_END 16.)
SAME_CHECKPOINT = [
    ("on_fit_start@0",), ("on_sanity_check_end@0",), ("on_train_start@0", "on_train_epoch_start@0"),
    ("on_train_batch_start@11",), ("training_step@11", "on_before_backward@11"),
    ("on_after_backward@11", "on_before_optimizer_step@11"),
    ("on_train_batch_end@11", "every_n_train_steps/epoch=1-step=4"), ("on_before_zero_grad@12",),
    ("on_train_batch_start@13", "on_validation_end@12", "on_validation/epoch=1-step=4"),
    ("training_step@13", "on_before_backward@13"),
    ("on_after_backward@13", "on_train_batch_end@13", "after_fit:max_time", "after_fit:should_stop"),
    ("on_train_batch_end@12", "on_validation_start@12", "on_validation_batch_end@12"),
    ("on_validation_epoch_end@12",), ("on_train_batch_end@16",),
    ("on_validation_end@16", "on_validation/epoch=1-step=6"),
    ("on_train_epoch_end@16", "every_n_epochs/epoch=1-step=6"), ("on_train_epoch_start@16", "after_fit:max_epochs"),
    ("train_time_interval/epoch=0-step=1",), ("save_last/last",), ("after_fit:max_steps",),
    ("after_fit:early_stopping",), ("after_fit:exception",), ("after_fit:sigterm",),
]
# Every distinct checkpoint is resumed on `dropout`, whose global RNG feeds both the shuffle and the dropout masks; the
# two other configurations (the shuffle alone, the loader's own generator) resume one checkpoint per state of the epoch
# the loader order is restored in: not opened yet, mid-epoch (the batch trained again; counted done inside a window),
# finished, the next one not opened. The other cells repeat a case of the default run: RELIABILITY_FULL=1 runs them.
DEFAULT_CELLS = {
    "dropout": {group[0] for group in SAME_CHECKPOINT},
    "global_shuffle": {"on_train_epoch_start@0", f"training_step@{MID}", f"on_after_backward@{WINDOW}",
                       f"on_train_epoch_end@{EPOCH_END}", f"on_train_epoch_start@{EPOCH_END}"},
}
DEFAULT_CELLS["generator_shuffle"] = DEFAULT_CELLS["global_shuffle"]


def _cells() -> list[Any]:
    return [pytest.param(data, source, id=f"{data}-{source}",
                         marks=() if source in DEFAULT_CELLS[data] else pytest.mark.exhaustive)
            for data in DATA for source in SOURCES]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[dict, dict, dict[str, Path]]]:
    """Per data configuration, computed once: (reference state, recording run's state, {source: checkpoint})."""
    cache: dict[str, tuple[dict, dict, dict[str, Path]]] = {}

    def get(data: str) -> tuple[dict, dict, dict[str, Path]]:
        if data not in cache:
            env = dict(os.environ)  # seed_everything sets env vars; a module fixture outlives the per-test reset
            try:
                root = tmp_path_factory.mktemp(data)
                reference = state_of(*fit(data, root / "reference"))
                model, trainer, paths = record(data, root / "recording")
                paths.update({f"after_fit:{how}": end_fit(how, data, root / how) for how in AFTER_FIT})
                cache[data] = (reference, state_of(model, trainer), paths)
            finally:
                os.environ.clear()
                os.environ.update(env)
        return cache[data]

    return get


@pytest.mark.parametrize(("data", "source"), _cells())
def test_resuming_from_every_checkpoint_source_is_bit_exact(recorded: Any, data: str, source: str, tmp_path: Path):
    reference, _, paths = recorded(data)
    assert resume_and_compare(data, tmp_path, paths[source], reference) == []


def _content(ckpt: Path) -> dict[str, Any]:
    return {k: v for k, v in torch.load(ckpt, weights_only=True).items() if k != "callbacks"}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_the_groups_cover_every_source():
    assert sorted(source for group in SAME_CHECKPOINT for source in group) == sorted(SOURCES)


@pytest.mark.parametrize("data", DATA)
def test_a_group_saves_one_checkpoint(recorded: Any, data: str):
    """What lets the default run resume one source per group: the sources of a group save the same checkpoint
    (the ModelCheckpoint states aside), so resuming one is resuming every one. A source that starts saving something
    else fails here, and then belongs in a group of its own."""
    paths = recorded(data)[2]
    apart = [(group[0], other) for group in SAME_CHECKPOINT for other in group[1:]
             if not _equal(_content(paths[group[0]]), _content(paths[other]))]
    assert apart == []
    distinct = [group[0] for group in SAME_CHECKPOINT]
    alike = [(a, b) for i, a in enumerate(distinct) for b in distinct[i + 1:]
             if _equal(_content(paths[a]), _content(paths[b]))]
    assert alike == []  # the groups are not finer than they need be either


@pytest.mark.parametrize("source", sorted(set(SOURCES) - {"after_fit:max_time"}))  # max_time stops where it may
def test_each_source_records_the_position_of_its_rule(recorded: Any, source: str):
    assert batches_done(recorded("global_shuffle")[2][source]) == EXPECTED_DONE[source]


@pytest.mark.parametrize("data", DATA)
def test_the_recording_run_equals_the_reference(recorded: Any, data: str):
    """Thirty-odd saves from every hook change nothing in the run that takes them."""
    reference, recording, _ = recorded(data)
    assert differences(reference, recording) == []


def test_a_checkpoint_one_batch_off_is_detected(recorded: Any, tmp_path: Path):
    """The comparison can fail: resuming the mid-epoch checkpoint as if it were one batch earlier does."""
    reference, _, paths = recorded("dropout")
    ckpt = paths[f"on_train_batch_end@{MID}"]
    progress = {**torch.load(ckpt, weights_only=True)["progress"], "total_batches": MID - 1}
    model, trainer = fit("dropout", tmp_path, seed=1234, ckpt=ckpt)
    assert differences(reference, state_of(model, trainer), progress) != []


# --- ddp on 2 ranks: a representative cell per stop point and kind of source, one launch per data configuration
DDP = {"devices": 2, "strategy": "ddp", "n_train": 64}  # 8 batches per rank per epoch, as on one device
DDP_HOOKS = [("training_step", MID), ("on_before_optimizer_step", MID), ("on_after_backward", WINDOW),
             ("on_validation_end", AFTER_VAL), ("on_train_epoch_end", EPOCH_END)]
DDP_AFTER_FIT = ("max_steps", "max_time", "should_stop", "sigterm")


def _ddp_cells(rank: int, root: str, data: str) -> dict[str, list[str]]:
    base = Path(root)
    reference = state_of(*fit(data, base / "reference", **DDP))
    model, trainer, paths = record(data, base / "recording", hook_saves=DDP_HOOKS,
                                   model_checkpoints=("every_n_train_steps", "on_validation"), **DDP)
    out = {"recording": differences(reference, state_of(model, trainer))}
    paths.update({f"after_fit:{how}": end_fit(how, data, base / how, **DDP) for how in DDP_AFTER_FIT})
    for source, path in paths.items():
        out[source] = resume_and_compare(data, base / source.replace("/", "_"), path, reference, **DDP)
    return out


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("data", ["generator_shuffle", "dropout"])
def test_resume_matrix_under_ddp(tmp_path: Path, data: str):
    per_rank = run_distributed(_ddp_cells, str(tmp_path), data)
    assert len(per_rank[0]) == 1 + len(DDP_HOOKS) + 3 + len(DDP_AFTER_FIT)
    failures = {(rank, cell): diff for rank, cells in enumerate(per_rank) for cell, diff in cells.items() if diff}
    assert failures == {}


def test_checkpoints_around_the_optimizer_step_under_16_mixed(tmp_path: Path):
    """With a GradScaler, a checkpoint taken in on_before_optimizer_step holds unscaled gradients as
    backward left them (scaled), and the resumed step unscales them once: still bit-exact."""
    hooks = [("on_after_backward", MID), ("on_before_optimizer_step", MID), ("on_after_backward", WINDOW)]
    reference = state_of(*fit("dropout", tmp_path / "reference", precision="16-mixed"))
    _, _, paths = record("dropout", tmp_path / "recording", hook_saves=hooks, model_checkpoints=(),
                         precision="16-mixed")
    assert {source: resume_and_compare("dropout", tmp_path / source, path, reference, precision="16-mixed")
            for source, path in paths.items()} == dict.fromkeys(paths, [])


class ManualNet(Net):
    """Manual optimization; saves from training_step before its backward (@k) or after its optimizer step (@-k)."""

    def __init__(self, dropout: float = 0.0, save_in_step: dict[int, Path] | None = None) -> None:
        super().__init__(dropout)
        self.automatic_optimization = False
        self.saves = save_in_step or {}

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt, k = self.optimizers(), self.trainer.total_batches + 1
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.losses.append(loss.detach().clone())
        if k in self.saves:
            self.trainer.save_checkpoint(self.saves[k])
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        if -k in self.saves:
            self.trainer.save_checkpoint(self.saves[-k])


def test_checkpoints_inside_a_manual_optimization_step(tmp_path: Path):
    """Before the step's optimizer step the batch is trained again; after it, the run goes on after the batch."""
    manual = {"model_cls": ManualNet, "accumulate_grad_batches": 1}
    reference = state_of(*fit("dropout", tmp_path / "reference", **manual))
    saves = {MID: tmp_path / "before_step.ckpt", -WINDOW: tmp_path / "after_step.ckpt"}
    fit("dropout", tmp_path / "recording", save_in_step=saves, **manual)
    assert [batches_done(path) for path in saves.values()] == [MID - 1, WINDOW]
    assert {name: resume_and_compare("dropout", tmp_path / str(name), path, reference, **manual)
            for name, path in saves.items()} == dict.fromkeys(saves, [])
