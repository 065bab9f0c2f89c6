"""The YAML command line (trainer/cli/command.py): runs match Python, overrides apply, the saved config reproduces the
run, and every config mistake exits with code 2, naming the file and the key, before anything starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from callbacks import EarlyStopping, ModelCheckpoint
from tests.helpers.boring import QUIET
from tests.scripts.cli_modules import RegressionData, Regressor
from trainer import Trainer, seed_everything
from trainer.cli import CLIError, main, run
from trainer.loggers import CSVLogger
from trainer.seed import SEED_ENV, seed_worker

REPO = Path(__file__).resolve().parents[1]
QUIET_YAML = """\
trainer:
  accelerator: cpu
  devices: 1
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
"""
BORING = """\
seed_everything: 7
model:
  class_path: tests.helpers.boring.BoringModel
  init_args: {batch_size: 4, length: 32}
"""


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # run() adds the working directory


def _write(name: str, text: str) -> str:
    Path(name).write_text(textwrap.dedent(text))
    return name


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_yaml_run_gives_the_same_weights_as_python():
    config = _write("run.yaml", QUIET_YAML + """\
  max_epochs: 2
seed_everything: 3
model:
  class_path: tests.scripts.cli_modules.Regressor
  init_args: {hidden: 4, lr: 0.1}
data:
  _target_: tests.scripts.cli_modules.RegressionData
  batch_size: 16
""")
    out = run(["fit", "--config", config])
    assert isinstance(out.datamodule, RegressionData) and out.trainer.global_step == 8

    seed_everything(3)
    model = Regressor(hidden=4, lr=0.1)
    Trainer(**QUIET, max_epochs=2).fit(model, datamodule=RegressionData(batch_size=16))
    _assert_same(_weights(out.model), _weights(model))


def test_dotted_overrides_and_later_files_win():
    base = _write("base.yaml", BORING + QUIET_YAML + "  max_epochs: 3\n")
    extra = _write("extra.yaml", "trainer:\n  max_epochs: 2\n")
    out = run(["fit", "--config", base, "--config", extra, "model.init_args.batch_size=8", "trainer.max_steps=5"])
    assert out.trainer.max_epochs == 2 and out.trainer.max_steps == 5
    assert out.model.batch_size == 8 and out.trainer.global_step == 5  # 4 steps per epoch, stopped by max_steps
    assert out.config["model"]["init_args"] == {"batch_size": 8, "length": 32}


def test_saved_config_is_resolved_and_reproduces_the_run(monkeypatch):
    monkeypatch.setenv("CLI_TEST_LENGTH", "48")
    length = "length: '${oc.decode:${oc.env:CLI_TEST_LENGTH,32}}'"  # quoted: a comma inside a {...} mapping
    config = _write("run.yaml", BORING.replace("length: 32", length) + """\
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: 2
  log_every_n_steps: ${trainer.max_epochs}
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: root
logger:
  class_path: CSVLogger
  init_args: {save_dir: "${trainer.default_root_dir}/logs", name: cli}
callbacks:
  - {class_path: EarlyStopping, init_args: {monitor: val_loss, patience: 5}}
  - {_target_: callbacks.ModelCheckpoint, dirpath: "${trainer.default_root_dir}/ckpts", save_last: true}
""")
    first = run(["fit", "--config", config])
    trainer = first.trainer
    assert isinstance(trainer.logger, CSVLogger) and trainer.early_stopping_callback is not None
    assert isinstance(trainer.checkpoint_callback, ModelCheckpoint) and Path("root/ckpts/last.ckpt").is_file()
    assert isinstance(trainer.early_stopping_callback, EarlyStopping)
    saved = Path(trainer.log_dir) / "config.yaml"
    assert saved.samefile("root/logs/cli/version_0/config.yaml")
    text = saved.read_text()
    assert "${" not in text and "length: 48" in text and "log_every_n_steps: 2" in text
    assert "save_dir: root/logs" in text

    monkeypatch.delenv("CLI_TEST_LENGTH")  # the saved config no longer depends on it
    second = run(["fit", "--config", str(saved)])
    assert Path(second.trainer.log_dir).name == "version_1"
    assert (Path(second.trainer.log_dir) / "config.yaml").read_text() == text
    _assert_same(_weights(first.model), _weights(second.model))
    assert second.trainer.global_step == first.trainer.global_step == 24  # 48 / 4 steps per epoch, 2 epochs


def test_print_config_prints_the_resolved_config_and_runs_nothing(capsys):
    config = _write("run.yaml", BORING + QUIET_YAML + "  max_epochs: 2\n  max_steps: ${trainer.max_epochs}\n")
    assert run(["fit", "--config", config, "--print_config", "trainer.max_epochs=4"]) is None
    printed = capsys.readouterr().out
    assert "max_steps: 4" in printed and "class_path: tests.helpers.boring.BoringModel" in printed
    assert not Path("config.yaml").exists()


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluation_subcommands(subcommand):
    config = _write("run.yaml", BORING + QUIET_YAML)
    out = run([subcommand, "--config", config])
    if subcommand == "predict":
        assert len(out.result) == 8  # 32 samples in batches of 4
    else:
        assert f"{'val' if subcommand == 'validate' else 'test'}_loss" in out.result[0]
    assert Path("config.yaml").is_file()  # logger=False: the log dir is default_root_dir (the cwd)


def test_seed_true_picks_a_seed_and_records_it():
    config = _write("run.yaml", BORING.replace("seed_everything: 7", "seed_everything: true") + QUIET_YAML)
    run(["test", "--config", config])
    saved = yaml.safe_load(Path("config.yaml").read_text())
    assert isinstance(saved["seed_everything"], int) and str(saved["seed_everything"]) == os.environ[SEED_ENV]


def test_the_seed_also_seeds_the_dataloader_workers():
    """As LightningCLI does: `seed_everything(seed, workers=True)`, so the Trainer's loaders seed their workers."""
    out = run(["fit", "--config", _write("run.yaml", BORING + QUIET_YAML + "  max_epochs: 1\n")])
    assert out.trainer.train_dataloader.worker_init_fn.func is seed_worker


def test_ckpt_path_resumes_from_a_checkpoint():
    config = _write("run.yaml", BORING + QUIET_YAML.replace("enable_checkpointing: false", "enable_checkpointing: true")
                    + "  max_epochs: 1\n  default_root_dir: root\n")
    first = run(["fit", "--config", config])
    path = first.trainer.checkpoint_callback.best_model_path
    second = run(["fit", "--config", config, "trainer.max_epochs=2", f"ckpt_path={path}"])
    assert first.trainer.global_step == 8 and second.trainer.global_step == 16


def test_digits_example_config_trains():
    config = str(REPO / "examples" / "configs" / "digits.yaml")
    out = run(["fit", "--config", config, "trainer.max_epochs=1", "trainer.limit_train_batches=2",
               "trainer.limit_val_batches=1", "trainer.logger=false", "trainer.enable_progress_bar=false",
               "trainer.default_root_dir=digits"])
    assert type(out.model).__name__ == "ConvNet" and type(out.datamodule).__name__ == "DigitsData"
    assert out.trainer.global_step == 2 and Path("digits/config.yaml").is_file()


# --- errors: exit code 2, file and key named, no traceback, nothing started --------------------------------
ERRORS = {
    "unknown trainer key": (BORING + QUIET_YAML + "  max_epocs: 2\n", [],
                            ["run.yaml: trainer.max_epocs:", "did you mean 'max_epochs'?"]),
    "unknown section": (BORING + QUIET_YAML + "traner: {}\n", [], ["run.yaml: traner:", "did you mean 'trainer'?"]),
    "unknown init arg": (BORING.replace("batch_size", "batch_sise") + QUIET_YAML, [],
                         ["run.yaml: model.init_args.batch_sise:", "did you mean 'batch_size'?"]),
    "key beside class_path": (BORING.replace("init_args", "init_arg") + QUIET_YAML, [],
                              ["run.yaml: model.init_arg:", "did you mean 'init_args'?"]),
    "module not found": (BORING.replace("tests.helpers.boring", "tests.helpers.nope") + QUIET_YAML, [],
                         ["run.yaml: model.class_path:", "cannot import 'tests.helpers.nope.BoringModel'"]),
    "class not found": (BORING.replace("BoringModel", "BoringModle") + QUIET_YAML, [],
                        ["run.yaml: model.class_path:", "did you mean 'BoringModel'?"]),
    "callback not found": (BORING + QUIET_YAML + "callbacks:\n  - class_path: EarlyStoping\n", [],
                           ["run.yaml: callbacks[0].class_path:", "did you mean 'EarlyStopping'?"]),
    "missing callback argument": (BORING + QUIET_YAML + "callbacks:\n  - class_path: EarlyStopping\n", [],
                                  ["run.yaml: callbacks[0].init_args:", "needs the argument 'monitor'"]),
    "wrong type": (BORING + QUIET_YAML + "  max_epochs: ten\n", [],
                   ["run.yaml: trainer.max_epochs:", "expects int | None, got str 'ten'"]),
    "wrong init arg type": (BORING.replace("batch_size: 4", "batch_size: 4.5") + QUIET_YAML, [],
                            ["run.yaml: model.init_args.batch_size:", "expects int"]),
    "trainer rejects a value": (BORING + QUIET_YAML.replace("accelerator: cpu", "accelerator: tpu"), [],
                                ["run.yaml: trainer.accelerator:", "accelerator='tpu' is not supported"]),
    "missing model": (QUIET_YAML, [], ["run.yaml: model: missing section"]),
    "model not a TrainModule": (QUIET_YAML + "model: {_target_: torch.nn.Identity}\n", [],
                                ["run.yaml: model._target_:", "'torch.nn.Identity' is not a subclass of TrainModule"]),
    "unresolved interpolation": (BORING + QUIET_YAML + "  max_epochs: ${trainer.epochs}\n", [],
                                 ["run.yaml: trainer.max_epochs:", "Interpolation key 'trainer.epochs' not found"]),
    "unset environment variable": (BORING + QUIET_YAML + "  default_root_dir: ${oc.env:CLI_TEST_UNSET}\n", [],
                                   ["run.yaml: trainer.default_root_dir:", "'CLI_TEST_UNSET' not found"]),
    "malformed yaml": (BORING + "trainer:\n  max_epochs: [1, 2\n  devices: 1\n", [],
                       ["run.yaml: malformed YAML at line 7"]),
    "unknown key in an override": (BORING + QUIET_YAML, ["trainer.max_epoch=1"],
                                   ["command line: trainer.max_epoch:", "did you mean 'max_epochs'?"]),
    "override without a value": (BORING + QUIET_YAML, ["trainer.max_epochs"],
                                 ["command line: 'trainer.max_epochs': expected an override key.sub=value"]),
    "logger given twice": (BORING + QUIET_YAML + "logger: false\n", [], ["run.yaml: logger: given twice"]),
    "a scalar config": ("5\n", [], ["run.yaml: the top level is int 5, but a config must be a mapping of sections"]),
    "a string config": ("fit\n", [], ["run.yaml: the top level is str 'fit', but a config must be a mapping"]),
    "a list config": ("- model\n", [], ["run.yaml: the top level is list ['model']"]),
    "trainer: null": (BORING + "trainer: null\n", [], ["run.yaml: trainer: is empty (null), so every Trainer "
                                                       "argument would silently take its default"]),
    "trainer: with nothing under it": (BORING + "trainer:\n#  max_epochs: 3\n", [], ["run.yaml: trainer: is empty"]),
    "trainer=null on the command line": (BORING + QUIET_YAML, ["trainer=null"], ["command line: trainer: is empty"]),
    "a string bool": (BORING + QUIET_YAML + "  use_distributed_sampler: 'false'\n", [],
                      ["run.yaml: trainer.use_distributed_sampler:", "expects bool, got str 'false'"]),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_config_errors_exit_2_naming_file_and_key(case, capsys):
    text, overrides, expected = ERRORS[case]
    config = _write("run.yaml", text)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", config, *overrides])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("trainer: error: ") and "Traceback" not in err
    for fragment in expected:
        assert fragment in err, err
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    assert not Path("config.yaml").exists()


def test_a_config_that_is_not_utf8_names_the_file_and_the_byte(capsys):
    Path("run.yaml").write_bytes(BORING.encode() + b"# caf\xe9\n" + QUIET_YAML.encode())
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "run.yaml"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert "run.yaml: not UTF-8 text: byte 0xe9 at line 5, column 6; save the config as UTF-8" in err, err


def test_trainer_null_in_a_later_file_names_that_file():
    _write("base.yaml", BORING + QUIET_YAML)
    _write("later.yaml", "trainer: null\n")
    with pytest.raises(CLIError, match=r"^later.yaml: trainer: is empty \(null\)"):
        run(["fit", "--config", "base.yaml", "--config", "later.yaml"])


def test_missing_config_file_and_cli_errors_are_cli_errors(capsys):
    with pytest.raises(CLIError, match="nope.yaml: config file not found"):
        run(["fit", "--config", "nope.yaml"])
    with pytest.raises(SystemExit) as info:  # argparse: unknown subcommand
        main(["train", "--config", "nope.yaml"])
    assert info.value.code == 2 and "invalid choice: 'train'" in capsys.readouterr().err


# --- real processes ---------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _run_cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`python -m trainer ...` in its own session; on timeout the whole group (every rank) is killed."""
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *args], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"python -m trainer {' '.join(args)} ran past {timeout} s:\n{out}\n{err}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(120)
def test_python_m_trainer_error_exits_2_without_traceback():
    config = _write("run.yaml", BORING + QUIET_YAML + "  max_epocs: 2\n")
    done = _run_cli(["fit", "--config", config], timeout=100)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "run.yaml: trainer.max_epocs:" in done.stderr


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_two_cpu_ranks_from_the_command_line():
    config = _write("run.yaml", BORING + QUIET_YAML + """\
  max_epochs: 2
  default_root_dir: root
callbacks:
  - {class_path: tests.scripts.cli_modules.WeightDump, init_args: {out: dumps}}
""")
    done = _run_cli(["fit", "--config", config, "trainer.devices=2", "trainer.strategy=ddp"], timeout=110)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [torch.load(f"dumps/rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2] and ranks[0]["global_step"] == 8  # 32 / (2 ranks * 4) * 2
    _assert_same(ranks[0]["state_dict"], ranks[1]["state_dict"])
    assert list(Path(".").rglob("config.yaml")) == [Path("root/config.yaml")]  # written once, by rank 0


def test_a_lightning_style_config_with_nulls_runs():
    """The `trainer:` keys a Lightning 2.x config holds (what its --print_config writes), with nulls for defaults."""
    lightning_keys = """\
      min_steps: null
      max_steps: 6
      limit_train_batches: null
      limit_val_batches: null
      val_check_interval: null
      num_sanity_val_steps: null
      log_every_n_steps: null
      precision: null
      deterministic: null
      benchmark: null
      inference_mode: true
      sync_batchnorm: false
      gradient_clip_algorithm: null
    """
    config = _write("run.yaml", BORING + QUIET_YAML + textwrap.indent(textwrap.dedent(lightning_keys), "  "))
    out = run(["fit", "--config", config])
    assert out.trainer.global_step == 6 and out.trainer.fit_state.spec.limit_train_batches == 1.0
