"""Two runs started at the same moment on one folder: each keeps its own run folder, its own checkpoint names and
its own in-flight temp files. A pair of forked processes starts every trial at one barrier; 10 trials, 100 with
RELIABILITY_FULL=1 (docs/reliability.md)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.checkpoint_io.atomic_file import TMP_MARKER, atomic_save, remove_stale_temp_files
from strategies.checkpoint_io.safe_load import safe_load
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, seed_everything

TRIALS = 100 if os.environ.get("RELIABILITY_FULL") == "1" else 10
pytestmark = pytest.mark.timeout(60 + 6 * TRIALS)


def _pair(fn: Callable[..., Any], *args: Any) -> list[list[Any]]:
    """Run `fn(who, trial, *args)` for who in (0, 1) in two forked processes, both released by one barrier per
    trial; return each process's results per trial. A process that fails or hangs fails the test."""
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(2), ctx.Queue()

    def child(who: int) -> None:
        torch.set_num_threads(1)
        try:
            results = []
            for trial in range(TRIALS):
                barrier.wait(timeout=60)
                results.append(fn(who, trial, *args))
            queue.put((who, "ok", pickle.dumps(results)))
        except BaseException:
            queue.put((who, "error", traceback.format_exc()))
        finally:
            queue.close()
            queue.join_thread()  # the result reaches the pipe before the process ends
            os._exit(0)

    procs = [ctx.Process(target=child, args=(who,)) for who in (0, 1)]
    for proc in procs:
        proc.start()
    out: dict[int, Any] = {}
    try:
        for _ in procs:
            who, status, payload = queue.get(timeout=30 + 5 * TRIALS)
            if status == "error":
                raise AssertionError(f"process {who} failed:\n{payload}")
            out[who] = pickle.loads(payload)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return [out[0], out[1]]


def _run(who: int, trial: int, root: str, logger: bool) -> dict[str, Any]:
    seed_everything(100 * trial + who)  # each run its own weights
    model = BoringModel()
    flags = {**QUIET, "logger": logger, "enable_checkpointing": True}
    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0,
                      default_root_dir=os.path.join(root, str(trial)), **flags)
    trainer.fit(model)
    assert trainer.checkpoint_callback is not None
    return {"log_dir": trainer.log_dir, "best": trainer.checkpoint_callback.best_model_path,
            "weights": {k: v.clone() for k, v in model.state_dict().items()}}


@pytest.mark.distributed
@pytest.mark.parametrize("logger", [True, False], ids=["default_logger", "logger_false"])
def test_two_runs_started_at_once_keep_their_own_folders_and_checkpoints(tmp_path: Path, logger: bool):
    first, second = _pair(_run, str(tmp_path), logger)
    lost = 0
    for trial in range(TRIALS):
        a, b = first[trial], second[trial]
        if logger:
            assert a["log_dir"] != b["log_dir"], f"trial {trial}: both runs in {a['log_dir']}"
            assert sorted(p.name for p in (tmp_path / str(trial) / "runs").iterdir()) == ["version_0", "version_1"]
        assert a["best"] != b["best"], f"trial {trial}: both runs saved {a['best']}"
        for run in (a, b):
            saved = safe_load(run["best"])["state_dict"]
            lost += not all(torch.equal(saved[k], v) for k, v in run["weights"].items())
        names = sorted(p.name for p in Path(a["best"]).parent.iterdir()) if not logger else []
        assert not logger and names == ["epoch=1-step=4-v1.ckpt", "epoch=1-step=4.ckpt"] or logger, names
    assert lost == 0, f"{lost} run(s) of {2 * TRIALS} found another run's weights in their best_model_path"
    orphans = [p for p in tmp_path.rglob("*") if TMP_MARKER in p.name or p.name.endswith(".claim")]
    assert not orphans, f"temp files or name claims left behind: {orphans}"


def _save_or_clean(who: int, trial: int, root: str) -> int:
    """Process 0 saves 5 checkpoints (a live run); process 1 starts clean-ups in the same folder meanwhile."""
    folder = Path(root) / str(trial)
    folder.mkdir(exist_ok=True)
    if who == 0:
        state = {"weights": torch.randn(512, 1024)}  # 2 MB: a save takes long enough to be caught mid-write
        for step in range(5):
            atomic_save({**state, "step": step}, folder / "live.ckpt")
        (folder / "done").touch()
        return 5
    cleaned = 0
    while not (folder / "done").exists():
        cleaned += len(remove_stale_temp_files(folder))
    return cleaned


@pytest.mark.distributed
def test_clean_up_never_removes_a_live_writers_temp_file(tmp_path: Path):
    saver, cleaner = _pair(_save_or_clean, str(tmp_path))  # a removed in-flight temp file fails the saver
    assert saver == [5] * TRIALS and sum(cleaner) == 0
    for trial in range(TRIALS):
        assert sorted(p.name for p in (tmp_path / str(trial)).iterdir()) == ["done", "live.ckpt"]
        assert safe_load(tmp_path / str(trial) / "live.ckpt")["step"] == 4
    assert not list(tmp_path.rglob(f"*{TMP_MARKER}*"))


def test_two_runs_into_one_model_checkpoint_folder_version_the_name(tmp_path: Path):
    folder = tmp_path / "ckpts"

    def fit(seed: int, epochs: int = 2, **kwargs: Any) -> tuple[ModelCheckpoint, BoringModel, Trainer]:
        seed_everything(seed)
        model, cb = BoringModel(), ModelCheckpoint(dirpath=folder, save_last=True)
        trainer = Trainer(max_epochs=epochs, limit_train_batches=2, limit_val_batches=0, callbacks=[cb],
                          **{**QUIET, "enable_checkpointing": True})
        trainer.fit(model, **kwargs)
        return cb, model, trainer

    first, first_model, _ = fit(0)
    first_bytes = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.warns(UserWarning) as record:
        second, second_model, _ = fit(1)
    messages = [str(w.message) for w in record]
    assert f"Checkpoint directory {folder} exists and is not empty." in messages
    assert any(f"{folder / 'last.ckpt'} exists (written by another run, or earlier in this one); this run saves "
               f"{folder / 'last-v1.ckpt'}" in m
               for m in messages), messages
    assert sorted(p.name for p in folder.iterdir()) == [
        "epoch=1-step=4-v1.ckpt", "epoch=1-step=4.ckpt", "last-v1.ckpt", "last.ckpt"]
    assert {name: (folder / name).read_bytes() for name in first_bytes} == first_bytes  # nothing overwritten
    assert (first.best_model_path, second.best_model_path) == (
        str(folder / "epoch=1-step=4.ckpt"), str(folder / "epoch=1-step=4-v1.ckpt"))
    assert torch.equal(safe_load(second.last_model_path)["state_dict"]["layer.weight"], second_model.layer.weight)
    # resuming the newest continues the second run and re-saves its own names in place (no -v2)
    third, third_model, trainer = fit(2, epochs=3, ckpt_path="last")
    assert trainer.global_step == 6 and third.last_model_path == str(folder / "last-v1.ckpt")
    assert sorted(p.name for p in folder.iterdir()) == [
        "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt", "last-v1.ckpt", "last.ckpt"]
    assert torch.equal(safe_load(folder / "last-v1.ckpt")["state_dict"]["layer.weight"], third_model.layer.weight)
    assert {name: (folder / name).read_bytes() for name in first_bytes} == first_bytes


def test_the_non_empty_folder_warning_is_for_fit_only_as_in_lightning(tmp_path: Path):
    cb = ModelCheckpoint(dirpath=tmp_path / "ckpts")
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, callbacks=[cb],
                      **{**QUIET, "enable_checkpointing": True})
    model = BoringModel()
    trainer.fit(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.test(model, ckpt_path="best")
        trainer.predict(model, ckpt_path="best")
    assert not [w for w in record if "exists and is not empty" in str(w.message)]
    with pytest.warns(UserWarning, match="exists and is not empty"):
        Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                callbacks=[ModelCheckpoint(dirpath=cb.dirpath)], **{**QUIET, "enable_checkpointing": True}
                ).fit(BoringModel())
