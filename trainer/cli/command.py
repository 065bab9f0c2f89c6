"""`python -m trainer fit|validate|test|predict --config run.yaml [key.sub=value ...]`: YAML to a run
(and `python -m trainer consolidate <folder> <file>`, dispatched to trainer/cli/consolidate.py).

The config layer stays thin: YAML (omegaconf) becomes plain kwargs for the classes it names and for
`Trainer(...)`, checked against their signatures, so there is no second list of Trainer flags to keep in
step. Every mistake in the config is reported as `CLIError` (exit code 2, no traceback) naming the file
and the key path, before any model is built or any process group starts. Reading the files is cli_config.py's
job, building the objects they name cli_objects.py's; this module checks the sections and runs the subcommand.
Only these three import omegaconf; `import trainer` does not.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from callbacks.base import Callback
from strategies.checkpoint_io.filesystem import AnyPath, join, makedirs, open_file, to_path
from strategies.exceptions import ConfigError, MisconfigurationError
from trainer.cli.config import SECTIONS, CLIError, ConfigSources, apply_seed, load_config, resolve_config
from trainer.cli.objects import ObjectBuilder, did_you_mean, is_class_spec
from trainer.cli.slots import section_slots, trainer_slots
from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule
from trainer.trainer import Trainer

__all__ = ["CLIError", "CLIRun", "LightningArgumentParser", "LightningCLI", "ReduceLROnPlateau", "SaveConfig",
           "SaveConfigCallback", "main", "run"]

SUBCOMMANDS = ("fit", "validate", "test", "predict")
CONFIG_FILENAME = "config.yaml"


@dataclass
class CLIRun:
    """What a CLI run built and returned, for callers that drive the CLI from Python (tests, notebooks)."""

    trainer: Trainer
    model: TrainModule
    datamodule: DataModule | None
    result: Any
    config: dict[str, Any]


class SaveConfig(Callback):
    """Writes the resolved config into `trainer.log_dir` at setup, on global rank 0 only, so the run can be
    repeated with `--config <log_dir>/config.yaml`; loggers that keep files with the run (MLflow, W&B) also get
    a copy through `Logger.log_artifact`."""

    def __init__(self, text: str, filename: str = CONFIG_FILENAME) -> None:
        self.text = text
        self.filename = filename
        self.path: AnyPath | None = None

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        folder = to_path(trainer.log_dir)
        makedirs(folder)
        self.path = join(folder, self.filename)
        with open_file(self.path, "w") as handle:
            handle.write(self.text)
        if trainer.loggers:
            with tempfile.TemporaryDirectory() as tmp:
                local = os.path.join(tmp, self.filename)
                Path(local).write_text(self.text)
                for logger in trainer.loggers:
                    logger.log_artifact(local)


# --- checking a config before anything is built -----------------------------------------------------
def _check_sections(config: dict[str, Any], sources: ConfigSources, builder: ObjectBuilder) -> None:
    """Everything that can be checked without building an object: sections, keys, types, imports."""
    _check_layout(config, sources)
    trainer_cfg = config.get("trainer") or {}
    if not isinstance(trainer_cfg, dict):
        raise sources.error("trainer", f"must be a mapping of Trainer arguments, got {trainer_cfg!r}")
    builder.check_kwargs(Trainer, trainer_cfg, "trainer")
    if "logger" in trainer_cfg and config.get("logger") is not None:
        raise sources.error("logger", "given twice, here and as trainer.logger; keep one")
    _check_run_options(config, sources)
    for key, value in (("callbacks", config.get("callbacks")), ("trainer.callbacks", trainer_cfg.get("callbacks")),
                       ("logger", config.get("logger")), ("trainer.logger", trainer_cfg.get("logger"))):
        _check_spec_list(value, key, sources, allow_bool=key.endswith("logger"))
    slots = section_slots()
    for section in ("model", "data", "callbacks", "logger"):
        builder.check(config.get(section), section, slots[section])
    builder.arguments(Trainer, trainer_cfg, "trainer", make=False, slots=trainer_slots())


def _check_layout(config: dict[str, Any], sources: ConfigSources) -> None:
    """Only known sections; a model, and a model and data that name their class."""
    for section in config:
        if section not in SECTIONS:
            raise sources.error(str(section), f"unknown section '{section}'{did_you_mean(str(section), SECTIONS)}"
                                f" (sections: {', '.join(SECTIONS)})")
    if config.get("model") is None:
        raise CLIError(f"{sources.origin('model')}: model: missing section; name the TrainModule with "
                       "model: {class_path: package.module.Class, init_args: {...}}")
    for section in ("model", "data"):
        if section in config and config[section] is not None and not is_class_spec(config[section]):
            raise sources.error(section, "must name a class with class_path (and init_args) or _target_")
    if "trainer" in config and config["trainer"] is None:  # `trainer:` with every line under it commented out
        raise sources.error("trainer", "is empty (null), so every Trainer argument would silently take its "
                            "default; give the arguments (trainer: {max_epochs: 10, ...}) or remove the section")


def _check_run_options(config: dict[str, Any], sources: ConfigSources) -> None:
    """The top-level options of the run itself: `seed_everything` and `ckpt_path`."""
    seed = config.get("seed_everything")
    if seed is not None and not (isinstance(seed, bool) or (isinstance(seed, int) and seed >= 0)):
        raise sources.error("seed_everything", f"expected a non-negative int, true or null, got {seed!r}")
    ckpt_path = config.get("ckpt_path")
    if ckpt_path is not None and not isinstance(ckpt_path, str):
        raise sources.error("ckpt_path", f"expected a path or 'last', got {ckpt_path!r}")


def _check_spec_list(value: Any, key: str, sources: ConfigSources, allow_bool: bool) -> None:
    """callbacks and logger take one class spec or a list of them (logger also true/false)."""
    if value is None or (allow_bool and isinstance(value, bool)):
        return
    for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
        if not is_class_spec(item):
            where = key if i is None else f"{key}[{i}]"
            raise sources.error(where, f"expected a class spec (class_path/init_args or _target_), got {item!r}")


def _as_list(value: Any) -> list[Any]:
    if value is None or value is False:
        return []
    return list(value) if isinstance(value, list) else [value]


def _build_trainer(config: dict[str, Any], text: str, sources: ConfigSources, builder: ObjectBuilder) -> Trainer:
    slots = section_slots()
    kwargs = builder.arguments(Trainer, dict(config.get("trainer") or {}), "trainer", make=True, slots=trainer_slots())
    kwargs["callbacks"] = [*_as_list(kwargs.get("callbacks")),
                           *_as_list(builder.build(config.get("callbacks"), "callbacks", slots["callbacks"])),
                           SaveConfig(text)]
    if config.get("logger") is not None:
        kwargs["logger"] = builder.build(config["logger"], "logger", slots["logger"])
    try:
        return Trainer(**kwargs)
    except (ConfigError, MisconfigurationError) as exc:
        match = re.match(r"(\w+)=", str(exc))
        flag = match.group(1) if match and match.group(1) in kwargs else None
        raise sources.error(f"trainer.{flag}" if flag else "trainer", str(exc)) from None


def _seed(config: dict[str, Any]) -> None:
    config["seed_everything"] = apply_seed(config.get("seed_everything"))


# --- entry points ----------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainer", description="Run fit, validate, test or predict from YAML configs (see docs/cli.md); "
        "`trainer consolidate <folder> <file>` turns a sharded checkpoint folder into one file.")
    parser.add_argument("subcommand", choices=SUBCOMMANDS)
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="a YAML config; several are merged in order")
    parser.add_argument("--print_config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted overrides, applied last")
    return parser


def run(argv: list[str] | None = None) -> CLIRun | None:
    """Parse, check, build and run; raise CLIError for config mistakes. Returns None for --print_config."""
    args = _parser().parse_intermixed_args(argv)
    cwd = os.getcwd()
    if cwd not in sys.path:  # class paths such as examples.digits.ConvNet resolve from the working directory
        sys.path.insert(0, cwd)
    sources = ConfigSources()
    config = resolve_config(load_config(args.config, args.overrides, sources), sources)
    builder = ObjectBuilder(sources)
    _check_sections(config, sources, builder)
    if args.print_config:
        print(OmegaConf.to_yaml(config), end="")
        return None
    _seed(config)  # before the model is built: its initial weights follow the seed
    text = OmegaConf.to_yaml(config)
    slots = section_slots()
    model = builder.build(config["model"], "model", slots["model"])
    if not isinstance(model, TrainModule):
        raise sources.error("model", f"{type(model).__name__} is not a trainer.TrainModule")
    data = builder.build(config.get("data"), "data", slots["data"])
    if data is not None and not isinstance(data, DataModule):
        raise sources.error("data", f"{type(data).__name__} is not a trainer.DataModule")
    trainer = _build_trainer(config, text, sources, builder)
    entry = getattr(trainer, args.subcommand)
    result = entry(model=model, datamodule=data, ckpt_path=config.get("ckpt_path"))
    return CLIRun(trainer=trainer, model=model, datamodule=data, result=result, config=config)


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`trainer ...`, `python -m trainer ...`): config mistakes exit 2, no traceback.
    `trainer consolidate <folder> <file>` is a tool, not a config run (trainer/cli/consolidate.py)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["consolidate"]:
        from trainer.cli.consolidate import main as consolidate

        consolidate(args[1:])
        return
    try:
        run(argv)
    except CLIError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


# Lightning's CLI class lives here under its Lightning name (`from trainer.cli import LightningCLI`).
from trainer.cli.lightning_build import ReduceLROnPlateau  # noqa: E402
from trainer.cli.lightning_cli import LightningArgumentParser, LightningCLI, SaveConfigCallback  # noqa: E402
