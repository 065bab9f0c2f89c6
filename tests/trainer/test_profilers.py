"""Trainer(profiler=...): Lightning's simple, advanced and pytorch profilers write their reports (per stage, per
rank) with Lightning's action names; the pytorch trace is a Chrome trace that opens; off, nothing is wrapped."""

from __future__ import annotations

import functools
import json
import pstats
import re
from pathlib import Path
from typing import Any

import pytest

from callbacks import Callback
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, BoringModel, every_stage_module
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule
from trainer.profilers import AdvancedProfiler, PassThroughProfiler, PyTorchProfiler, SimpleProfiler


class Watch(Callback):
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        pass


def _fit(tmp_path: Path, profiler: Any, **flags: Any) -> Trainer:
    trainer = Trainer(profiler=profiler, callbacks=[Watch()],
                      **{**QUIET, "max_epochs": 2, "limit_val_batches": 2, "default_root_dir": tmp_path, **flags})
    trainer.fit(BoringModel())
    return trainer


def test_simple_writes_durations_per_action_into_the_run_folder(tmp_path: Path):
    _fit(tmp_path, "simple")
    report = (tmp_path / "fit-profile.txt").read_text()
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("|")}
    assert int(rows["run_training_batch"].split("|")[3]) == 16  # 8 batches x 2 epochs
    assert int(rows["run_training_epoch"].split("|")[3]) == 2
    assert "[Callback]Watch.on_train_batch_end" in rows and "run_validation" in rows and "run_sanity_check" in rows


def test_each_stage_has_its_report(tmp_path: Path):
    profiler = SimpleProfiler(filename="perf")
    trainer = _fit(tmp_path, profiler)
    trainer.validate(trainer.lightning_module, verbose=False)
    assert (tmp_path / "fit-perf.txt").is_file() and (tmp_path / "validate-perf.txt").is_file()


def test_advanced_reports_cprofile_stats_per_action_and_dumps_them(tmp_path: Path):
    _fit(tmp_path, AdvancedProfiler(filename="cprofile", line_count_restriction=10, dump_stats=True))
    report = (tmp_path / "fit-cprofile.txt").read_text()
    assert "Profile stats for: run_training_batch" in report and "_train_batch" in report
    stats = pstats.Stats(str(tmp_path / "fit-cprofile-run_training_batch.prof"))
    assert stats.total_calls > 0


def test_pytorch_writes_a_chrome_trace_with_the_actions(tmp_path: Path):
    profiler = PyTorchProfiler(filename="trace")
    _fit(tmp_path, profiler, max_epochs=1)
    assert profiler.trace_path == tmp_path / "fit-trace.pt.trace.json"
    events = json.loads(profiler.trace_path.read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"run_training_batch", "run_training_epoch", "[Callback]Watch.on_train_batch_end"} <= names
    assert any(name and name.startswith("aten::") for name in names)  # torch's own operators under them
    assert "Name" in (tmp_path / "fit-trace.txt").read_text()  # torch's operator table


def test_without_a_profiler_no_hook_is_wrapped():
    watch = Watch()
    trainer = Trainer(max_epochs=1, callbacks=[watch], **QUIET)
    assert isinstance(trainer.profiler, PassThroughProfiler)
    model = BoringModel()
    trainer.fit(model)
    (call,) = trainer.fit_state.hooks.targets("on_train_batch_end")
    # the plain dispatch, no timing around it: the callback's method with the trainer and the module bound
    assert isinstance(call, functools.partial)
    assert (call.func, call.args) == (watch.on_train_batch_end, (trainer, model))


def test_an_unknown_profiler_is_refused():
    with pytest.raises(ConfigError, match="profiler='fast' is not valid"):
        Trainer(profiler="fast")


def _fit_on_a_rank(rank: int, root: str) -> list[str]:
    _fit(Path(root), "simple", devices=2, strategy="ddp")
    return sorted(p.name for p in Path(root).glob("fit-profile*.txt"))


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_every_rank_writes_its_own_report(tmp_path: Path):
    run_distributed(_fit_on_a_rank, str(tmp_path))
    assert sorted(p.name for p in tmp_path.glob("fit-profile*.txt")) == ["fit-profile-0.txt", "fit-profile-1.txt"]


def test_simple_reports_the_module_strategy_and_data_actions_under_lightnings_names():
    profiler = SimpleProfiler()
    Trainer(profiler=profiler, **{**QUIET, "max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1}).fit(
        BoringModel())
    assert {"[Strategy]SingleDeviceStrategy.training_step", "[Strategy]SingleDeviceStrategy.backward",
            "[Strategy]SingleDeviceStrategy.validation_step", "[LightningModule]BoringModel.optimizer_step",
            "[LightningModule]BoringModel.configure_optimizers", "[LightningModule]BoringModel.train_dataloader",
            "[LightningModule]BoringModel.on_train_batch_start", "[_TrainingEpochLoop].train_dataloader_next",
            "[_EvaluationLoop].val_next"} <= set(profiler.recorded_durations)
    assert len(profiler.recorded_durations["[Strategy]SingleDeviceStrategy.training_step"]) == 2


def _profiled_actions(framework: Any, entry: str) -> set[str]:
    """The actions a SimpleProfiler records in one run of `entry` under Lightning (`framework`: its package) or
    ours (None)."""

    base, trainer_cls, simple = ((framework.LightningModule, framework.Trainer, framework.profilers.SimpleProfiler)
                                 if framework is not None else (TrainModule, Trainer, SimpleProfiler))

    Model = every_stage_module(base)
    profiler = simple()
    runner = trainer_cls(max_epochs=1, profiler=profiler, **QUIET)
    getattr(runner, entry)(Model(), **({"verbose": False} if entry in ("validate", "test") else {}))
    return set(profiler.recorded_durations)


@pytest.mark.parametrize("entry", ["fit", "validate", "test", "predict"])
def test_simple_records_the_actions_lightning_records(entry: str):
    """Every action of Lightning's report is in ours, but Lightning's strategy no-op hooks
    (`[Strategy]...on_train_start` and the like: our strategies have no such hooks); ours adds the loops' phases
    (`run_validation` and the like)."""
    pl = pytest.importorskip("lightning.pytorch")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = {a for a in _profiled_actions(pl, entry) if not re.match(r"\[Strategy\]\w+\.on_", a)}
        ours = _profiled_actions(None, entry)
    assert theirs - ours == set()


def test_the_report_comes_after_the_teardown_hooks_it_times(tmp_path: Path):
    """As Lightning's: nothing is timed after the report (torch's profiler crashed the interpreter at exit when a
    teardown hook was recorded after it had stopped)."""
    _fit(tmp_path, "simple")
    assert "[LightningModule]BoringModel.teardown" in (tmp_path / "fit-profile.txt").read_text()
