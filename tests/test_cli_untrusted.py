"""Configs made by an attacker or by a slip of the hand (issue 39, defects 4, 6 and the CLI items of 7): a config may
build only what each place expects, YAML aliases cannot blow up, and odd files and values are one clear line with
exit code 2. Every config here is written by the test itself; none may run the sentinel command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.launch import REPO, clean_env
from trainer.cli import main
from trainer.cli.config import ConfigSources
from trainer.cli.objects import ObjectBuilder
from trainer.cli.slots import argument_slots, refusal

QUIET = """\
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 1
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
"""


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # run() adds the working directory


def _cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `python -m trainer` in this process; it must exit 2 with one line of error and no traceback."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith("trainer: error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def _attacks(sentinel: Path) -> dict[str, str]:
    touch = f"touch {sentinel}"
    return {
        "class_path os.system": f"model:\n  class_path: os.system\n  init_args: {{command: '{touch}'}}\n",
        "_target_ subprocess.call": f"model:\n  _target_: subprocess.call\n  args: [touch, '{sentinel}']\n",
        "a callbacks entry": ("model: {class_path: tests.helpers.boring.BoringModel}\n"
                              "callbacks:\n  - class_path: subprocess.call\n"
                              f"    init_args: {{args: [touch, '{sentinel}']}}\n"),
        "a trainer.callbacks entry": ("model: {class_path: tests.helpers.boring.BoringModel}\n"
                                      + QUIET + f"  callbacks: [{{_target_: os.system, command: '{touch}'}}]\n"),
        "nested in an int argument": ("model:\n  class_path: tests.scripts.cli_modules.Regressor\n  init_args:\n"
                                      f"    hidden: {{class_path: os.system, init_args: {{command: '{touch}'}}}}\n"),
        "a class where a Callback goes": ("model: {class_path: tests.helpers.boring.BoringModel}\n"
                                          "callbacks: [{class_path: subprocess.Popen, init_args: "
                                          f"{{args: [touch, '{sentinel}']}}}}]\n"),
    }


EXPECTED = {
    "class_path os.system": "run.yaml: model.class_path: 'os.system' is a function, not a class; a config builds "
                            "classes here (TrainModule)",
    "_target_ subprocess.call": "run.yaml: model._target_: 'subprocess.call' is a function, not a class",
    "a callbacks entry": "run.yaml: callbacks[0].class_path: 'subprocess.call' is a function, not a class; a config "
                         "builds classes here (Callback)",
    "a trainer.callbacks entry": "run.yaml: trainer.callbacks[0]._target_: 'os.system' is a function",
    "nested in an int argument": "run.yaml: model.init_args.hidden.class_path: this place takes a plain value, not an "
                                 "object: 'os.system' is not built here",
    "a class where a Callback goes": "run.yaml: callbacks[0].class_path: 'subprocess.Popen' is not a subclass of "
                                     "Callback",
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_config_builds_only_what_each_place_expects(tmp_path: Path, capsys, case: str):
    """Defect 4: objects were built before their type was checked, so all of these ran (the nested one then trained
    with hidden=0, os.system's return value)."""
    sentinel = tmp_path / "pwned"
    Path("run.yaml").write_text(_attacks(sentinel)[case] + ("" if "trainer:" in _attacks(sentinel)[case] else QUIET))
    started = time.perf_counter()
    err = _cli_error(capsys, "fit", "--config", "run.yaml")
    elapsed = time.perf_counter() - started
    assert EXPECTED[case] in err, err
    assert not sentinel.exists(), "the config ran code"
    assert elapsed < 5


def _takes_a_callable(fn: Callable[[int], int], n: int = 1) -> None:
    """A constructor-like function whose first argument asks for a callable."""


def test_a_function_is_built_where_the_argument_asks_for_a_callable():
    """The check is by annotation, not a ban on functions: a Callable-annotated argument still takes one."""
    slots = argument_slots(_takes_a_callable)
    assert refusal(len, slots["fn"], "builtins.len") is None
    assert refusal(len, slots["n"], "builtins.len") is not None
    assert ObjectBuilder(ConfigSources()).build({"_target_": "collections.OrderedDict"}, "x") == {}


def test_lightning_cli_refuses_a_function_in_trainer_callbacks(tmp_path: Path):
    sentinel = tmp_path / "pwned"
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent(f"""\
        trainer:
          logger: false
          callbacks:
            - class_path: subprocess.call
              init_args: {{args: [touch, "{sentinel}"]}}
        """))
    result = subprocess.run([sys.executable, str(REPO / "tests" / "scripts" / "lightning_cli_app.py"), "fit",
                             f"--config={config}"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "trainer.callbacks[0].class_path: 'subprocess.call' is a function, not a class" in result.stderr
    assert "Traceback" not in result.stderr
    assert not sentinel.exists(), "the config ran code"


LAUGHS = "".join(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
                 for name, prev in zip("abcdefghi", ["", *"abcdefgh"], strict=True))


@pytest.mark.parametrize("cli", ["trainer", "LightningCLI"])
def test_billion_laughs_is_refused_at_once_whatever_omegaconf_allows(tmp_path: Path, cli: str):
    """Defect 6: 1 KB of nested aliases (9^9 values) ran over 60 s under both CLIs with omegaconf's own bound off."""
    config = tmp_path / "laughs.yaml"
    config.write_text(LAUGHS + ("model: {class_path: tests.helpers.boring.BoringModel}\n" if cli == "trainer" else ""))
    command = [sys.executable, "-m", "trainer", "fit", "--config", str(config)] if cli == "trainer" else [
        sys.executable, str(REPO / "tests" / "scripts" / "lightning_cli_app.py"), "fit", f"--config={config}"]
    env = clean_env(OMEGACONF_MAX_YAML_EXPANDED_NODES="none")
    started = time.perf_counter()
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert result.returncode == 2, result.stderr[-2000:]
    assert re.search(r"laughs.yaml: its YAML aliases \(\*name\) expand to 4\d{8} more values, over the limit of "
                     "10000", result.stderr), result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 30


def test_an_alias_inside_itself_and_an_alias_bomb_on_the_command_line(capsys):
    Path("run.yaml").write_text("model: {class_path: tests.helpers.boring.BoringModel}\nx: &x [*x]\n" + QUIET)
    assert "run.yaml: a YAML alias refers to the value that holds it (line 2)" in _cli_error(
        capsys, "fit", "--config", "run.yaml")
    Path("run.yaml").write_text("model: {class_path: tests.helpers.boring.BoringModel}\n" + QUIET)
    bomb = "trainer.max_epochs=[" + ", ".join(line.split(": ", 1)[1].strip() for line in LAUGHS.splitlines()) + "]"
    err = _cli_error(capsys, "fit", "--config", "run.yaml", bomb)
    assert "command line: 'trainer.max_epochs=[&a [lol" in err and "over the limit of 10000" in err, err


def _write_odd(kind: str, tmp_path: Path) -> tuple[str, str]:
    """An odd config and the message it must get."""
    path = tmp_path / f"{kind}.yaml"
    model = "model: {class_path: tests.helpers.boring.BoringModel}\n"
    if kind == "fifo":
        os.mkfifo(path)
        return str(path), "is not a regular file (a FIFO, device or socket); --config takes a YAML file"
    if kind == "dev-zero":
        return "/dev/zero", "/dev/zero: is not a regular file"
    if kind == "4 GB":
        with open(path, "wb") as handle:
            handle.truncate(4 << 30)  # sparse: no disk used
        return str(path), "is 4294967296 bytes; a config may hold at most 8 MiB"
    if kind == "100k-digit int":
        path.write_text(model + QUIET.replace("max_steps: 1", "max_steps: " + "9" * 100_000))
        return str(path), "a value cannot be read: Exceeds the limit (4300 digits)"
    if kind == "10k nested brackets":
        path.write_text(model.replace("}", ", init_args: {batch_size: " + "[" * 10_000 + "]" * 10_000 + "}}") + QUIET)
        return str(path), "malformed YAML at line 1, column"
    if kind == "relative class_path":
        path.write_text("model: {class_path: ..boring.BoringModel}\n" + QUIET)
        return str(path), "model.class_path: must be an import path like 'package.module.Class' (no leading dot"
    path.mkdir()
    return str(path), "is a directory; --config takes a YAML file"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "4 GB", "100k-digit int", "10k nested brackets",
                                  "relative class_path", "directory"])
def test_odd_config_files_and_values_are_one_clear_line(tmp_path: Path, capsys, kind: str):
    """Defect 7 (CLI): these gave raw tracebacks, 'not found', or read a 4 GB file into memory."""
    path, expected = _write_odd(kind, tmp_path)
    started = time.perf_counter()
    err = _cli_error(capsys, "fit", "--config", path)
    assert expected in err, err
    assert time.perf_counter() - started < 5


def test_a_100k_digit_override_is_one_clear_line(capsys):
    Path("run.yaml").write_text("model: {class_path: tests.helpers.boring.BoringModel}\n" + QUIET)
    err = _cli_error(capsys, "fit", "--config", "run.yaml", "trainer.max_steps=" + "9" * 100_000)
    assert "command line: 'trainer.max_steps=999" in err and "cannot parse" in err, err


def test_the_python_m_trainer_command_line_says_it_in_one_line(tmp_path: Path):
    """The same through the real command, as a user runs it (no traceback storm, exit 2)."""
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  class_path: os.system\n  init_args: {{command: 'touch {tmp_path / 'pwned'}'}}\n")
    result = subprocess.run([sys.executable, "-m", "trainer", "fit", "--config", str(config)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "pwned").exists()
