"""`trainer.cli.LightningCLI`: a script written on Lightning's CLI runs with its imports renamed and trains exactly as
under Lightning (tests/scripts/lightning_cli_app.py is that script; FRAMEWORK=lightning runs it on Lightning 2.x),
and the CLI's own behaviour (run=False, subclass mode, links, errors, the saved config) holds."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.helpers.launch import REPO, assert_ok, clean_env, launch

SCRIPT = REPO / "tests" / "scripts" / "lightning_cli_app.py"
CONFIG = """
trainer:
  max_epochs: 3
  limit_val_batches: null
  logger: null
model:
  hidden: 6
optimizer:
  class_path: torch.optim.Adam
  init_args: {lr: 0.01}
lr_scheduler:
  class_path: torch.optim.lr_scheduler.StepLR
  init_args: {step_size: 1, gamma: 0.5}
"""


def _app() -> Any:
    spec = importlib.util.spec_from_file_location("lightning_cli_app", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script(framework: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = clean_env(FRAMEWORK=framework)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def _fit(framework: str, tmp_path: Path, *extra: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    out = tmp_path / f"{framework}.pt"
    res = _script(framework, ["fit", "--config", "cfg.yaml", "--model.hidden", "5", "--trainer.max_epochs=2",
                              f"--trainer.default_root_dir={tmp_path / framework}", f"--out={out}", *extra], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(Path(f"{out}.json").read_text())
    summary["hparams"].pop("_instantiator", None)  # Lightning's marker for load_from_checkpoint
    return torch.load(out), summary


@pytest.fixture
def lightning_cli() -> None:
    pytest.importorskip("lightning.pytorch", reason="Lightning (the [dev] extra) is not installed")
    pytest.importorskip("jsonargparse", reason="Lightning's CLI needs jsonargparse (the [dev] extra)")


@pytest.mark.subprocess
@pytest.mark.timeout(240)
def test_fit_from_config_and_overrides_matches_lightning(tmp_path: Path, lightning_cli: None) -> None:
    """Config file + `--key value` / `--key=value` overrides, a link from the data module to the model, and the
    optimizer and scheduler from the config: the same weights, steps, hparams and metrics as Lightning's CLI."""
    ours, ours_summary = _fit("ours", tmp_path)
    theirs, their_summary = _fit("lightning", tmp_path)
    assert ours_summary == their_summary
    assert ours_summary["hparams"] == {"hidden": 5, "lr": 0.1, "num_classes": 3}  # num_classes linked from data
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.subprocess
@pytest.mark.timeout(240)
def test_print_config_matches_lightning_and_reruns(tmp_path: Path, lightning_cli: None) -> None:
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    dumps = {}
    for framework in ("ours", "lightning"):
        res = _script(framework, ["fit", "--config", "cfg.yaml", "--model.hidden=5", "--print_config"], tmp_path)
        assert res.returncode == 0, res.stderr
        dumps[framework] = yaml.safe_load(res.stdout)
    ours, theirs = dumps["ours"], dumps["lightning"]
    for key in ("seed_everything", "model", "data", "optimizer", "lr_scheduler", "out", "ckpt_path"):
        assert ours[key] == theirs[key], key
    # the link target (model.num_classes) is not settable, so neither prints it
    assert "num_classes" not in ours["model"]
    # every Trainer flag Lightning prints with a value, we print with the same value
    assert {k: v for k, v in theirs["trainer"].items() if v is not None and k in ours["trainer"]} == \
        {k: ours["trainer"][k] for k, v in theirs["trainer"].items() if v is not None and k in ours["trainer"]}
    # the dump is a complete config: running it trains as the original command line does
    (tmp_path / "dumped.yaml").write_text(yaml.safe_dump(ours))
    out = tmp_path / "rerun.pt"
    res = _script("ours", ["fit", "--config", "dumped.yaml", "--trainer.max_epochs=2", f"--out={out}",
                           f"--trainer.default_root_dir={tmp_path / 'rerun'}"], tmp_path)
    assert res.returncode == 0, res.stderr
    original, _ = _fit("ours", tmp_path)
    rerun = torch.load(out)
    assert all(torch.equal(original[k], rerun[k]) for k in original)


def test_run_false_builds_without_running(tmp_path: Path) -> None:
    cli = _app().main(args=["--trainer.max_epochs=4", "--model.lr=0.5", f"--trainer.default_root_dir={tmp_path}"],
                      run=False)
    assert cli.subcommand is None and cli.trainer.max_epochs == 4
    assert cli.model.hparams["lr"] == 0.5 and cli.model.hparams["num_classes"] == cli.datamodule.num_classes == 3
    assert cli.config.trainer.max_epochs == 4 and cli.config["model"]["lr"] == 0.5
    assert cli.trainer.global_step == 0
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 16


def test_subclass_mode_by_short_name_and_init_args(tmp_path: Path) -> None:
    app = _app()
    cli = app.CLI(None, app.Data, args=["--model=Net", "--model.hidden=3", "--data.batch_size=8"], run=False,
                  trainer_defaults={"default_root_dir": str(tmp_path)})
    assert type(cli.model).__name__ == "Net" and cli.model.hparams["hidden"] == 3
    assert cli.config.model.class_path.endswith(".Net") and cli.config.model.init_args.hidden == 3
    assert cli.datamodule.batch_size == 8


def test_structured_args_and_trainer_defaults_objects(tmp_path: Path) -> None:
    from callbacks import EarlyStopping
    from trainer.loggers import CSVLogger

    app = _app()
    stop, logger = EarlyStopping(monitor="val_loss"), CSVLogger(str(tmp_path))
    cli = app.CLI(app.Net, app.Data, run=False, args={"trainer": {"max_epochs": 2}, "model": {"hidden": 4}},
                  trainer_defaults={"callbacks": [stop], "logger": logger})
    assert cli.trainer.max_epochs == 2 and cli.model.hparams["hidden"] == 4
    assert stop in cli.trainer.callbacks and cli.trainer.logger is logger


def test_fit_subcommand_runs_hooks_and_saves_config(tmp_path: Path) -> None:
    app = _app()
    out = tmp_path / "w.pt"
    app.main(args=["fit", "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}", f"--out={out}"])
    assert out.exists()  # after_fit ran
    saved = yaml.safe_load((tmp_path / "runs" / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["max_epochs"] == 1 and saved["seed_everything"] == 7 and saved["out"] == str(out)


def test_saved_config_is_not_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = _app()
    args = ["fit", "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=trainer.loggers.CSVLogger", f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.logger.init_args.version=0"]
    app.main(args=args)
    with pytest.raises(RuntimeError, match="to NOT exist"):
        app.main(args=args)
    app.main(args=args, save_config_kwargs={"overwrite": True})


@pytest.mark.parametrize(("args", "message"), [
    (["fit", "--model.hiden=3"], "unknown argument 'hiden' of Net; did you mean 'hidden'"),
    (["fit", "--trainer.max_epoch=3"], "did you mean 'max_epochs'"),
    (["fot"], "unknown subcommand 'fot'"),
    ([], "expected a subcommand"),
    (["fit", "--bogus=1"], "unknown key 'bogus'"),
    (["fit", "--model.hidden"], "expects a value"),
    (["fit", "--model=Net"], "the class is fixed to Net"),
    (["fit", "--optimizer=NoSuchOpt"], "no Optimizer subclass named 'NoSuchOpt'"),
    (["fit", "--optimizer=Adam", "--optimizer.lrr=1"], "unknown argument 'lrr'"),
    (["fit", "--trainer.callbacks+=EarlyStopping"], "appending with += is not supported"),
])
def test_mistakes_exit_2_naming_the_key(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _app().main(args=args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_the_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _app().main(args=["fit", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--trainer.max_epochs" in text and "--model.hidden  (default: 8)" in text and "--out" in text


def test_parse_links_and_unsupported_parser_options(tmp_path: Path) -> None:
    from strategies.exceptions import ConfigError
    from trainer.cli import LightningCLI

    app = _app()

    class Linked(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.link_arguments("data.batch_size", "model.hidden")  # parse time: from the config value

    cli = Linked(app.Net, app.Data, run=False, args=["--data.batch_size=12"],
                 trainer_defaults={"default_root_dir": str(tmp_path)})
    assert cli.model.hparams["hidden"] == 12
    with pytest.raises(ConfigError, match="default_env=True"):
        LightningCLI(app.Net, app.Data, run=False, args=[], parser_kwargs={"default_env": True})


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_two_ranks_through_the_script(tmp_path: Path) -> None:
    """The launcher re-runs the script with the same command line on the second rank: both ranks parse it the same
    way, train, and one config is saved."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(SCRIPT), "fit", "--trainer.max_epochs=2", "--trainer.devices=2",
           "--trainer.strategy=ddp", "--seed_everything=true", f"--trainer.default_root_dir={out}"]
    (res,) = launch([(cmd, clean_env())], tmp_path / "logs")
    assert_ok([res])
    configs = list(out.rglob("config.yaml"))
    assert len(configs) == 1
    assert isinstance(yaml.safe_load(configs[0].read_text())["seed_everything"], int)  # the seed chosen, recorded


def test_ckpt_path_hparams_build_the_model(tmp_path: Path) -> None:
    """As Lightning does: `validate --ckpt_path=...` builds the model with the checkpoint's hyperparameters, so
    weights trained with --model.hidden=5 load without repeating the flag."""
    app = _app()
    app.main(args=["fit", "--trainer.max_epochs=1", "--model.hidden=5", f"--trainer.default_root_dir={tmp_path}"])
    (ckpt,) = (tmp_path / "runs" / "version_0" / "checkpoints").glob("*.ckpt")
    cli = app.main(args=["validate", f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.model.hparams["hidden"] == 5 and cli.config.validate.model.hidden == 5
