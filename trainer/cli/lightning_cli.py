"""`LightningCLI` for scripts written on Lightning's CLI: `python main.py fit --config c.yaml --trainer.max_epochs=3`.

Same subcommands, `--config` files, `--key=value` overrides, `--print_config`, `run=False`, subclass hooks
(`add_arguments_to_parser`, `before_fit`, `instantiate_classes`, ...), automatic optimizer/scheduler arguments and
the config saved into the run's folder. Underneath it is the omegaconf reading and the signature-checked building of
`python -m trainer` (trainer/cli/config.py, trainer/cli/objects.py); what the command line declares is recorded by
trainer/cli/lightning_parser.py, and building the objects is trainer/cli/lightning_build.py's job.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, cast

from omegaconf import OmegaConf

from callbacks.base import Callback
from strategies.checkpoint_io.filesystem import exists, join, makedirs, open_file, to_path
from trainer.cli.config import CLIError, ConfigSources, apply_seed
from trainer.cli.lightning_build import ConfigAssembler
from trainer.cli.lightning_instantiate import Instantiator
from trainer.cli.lightning_parser import LightningArgumentParser, split_command_line
from trainer.cli.objects import ObjectBuilder
from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule
from trainer.trainer import Trainer

__all__ = ["ArgsType", "LightningArgumentParser", "LightningCLI", "SaveConfigCallback"]

# What `LightningCLI(args=...)` takes instead of sys.argv: the command line's words, or the config as a dict.
ArgsType = list[str] | dict[str, Any] | None


class SaveConfigCallback(Callback):
    """Writes the run's full config to `<log_dir>/config.yaml` at setup (global rank 0), refusing to overwrite a
    previous run's file unless `overwrite=True`; subclass and override `save_config` to send it elsewhere."""

    def __init__(self, parser: LightningArgumentParser, config: Any, config_filename: str = "config.yaml",
                 overwrite: bool = False, multifile: bool = False, save_to_log_dir: bool = True) -> None:
        if multifile:
            raise CLIError("SaveConfigCallback(multifile=True) is not supported: the config is saved as one file")
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError("SaveConfigCallback(save_to_log_dir=False) only makes sense in a subclass that "
                             "overrides save_config (otherwise nothing would be saved)")
        self.parser, self.config = parser, config
        self.config_filename, self.overwrite = config_filename, overwrite
        self.multifile, self.save_to_log_dir = multifile, save_to_log_dir
        self.already_saved = False

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self.already_saved:
            return
        if self.save_to_log_dir and trainer.is_global_zero:
            folder = to_path(trainer.log_dir)
            path = join(folder, self.config_filename)
            if not self.overwrite and exists(path):
                raise RuntimeError(
                    f"SaveConfigCallback expected {path} to NOT exist. Aborting to avoid overwriting results of a "
                    "previous run. Delete the file, set LightningCLI(save_config_callback=None) to save no config, "
                    'or LightningCLI(save_config_kwargs={"overwrite": True}) to overwrite it.')
            makedirs(folder)
            with open_file(path, "w") as handle:
                handle.write(OmegaConf.to_yaml(self.config))
        self.already_saved = True
        self.save_config(trainer, pl_module, stage)

    def save_config(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Override to also save the config elsewhere (a logger's artifacts, ...); called on every rank."""


class LightningCLI:
    """Parses the command line and config files, builds the model, data module and Trainer, and runs the
    subcommand (`run=True`), or only builds them (`run=False`: then use `cli.trainer`, `cli.model`,
    `cli.datamodule`). See docs/cli.md for what is supported and how it differs from Lightning's."""

    def __init__(self, model_class: type[TrainModule] | Callable[..., TrainModule] | None = None,
                 datamodule_class: type[DataModule] | Callable[..., DataModule] | None = None,
                 save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
                 save_config_kwargs: dict[str, Any] | None = None,
                 trainer_class: type[Trainer] | Callable[..., Trainer] = Trainer,
                 trainer_defaults: dict[str, Any] | None = None, seed_everything_default: bool | int = True,
                 parser_kwargs: dict[str, Any] | None = None,
                 parser_class: type[LightningArgumentParser] = LightningArgumentParser,
                 subclass_mode_model: bool = False, subclass_mode_data: bool = False,
                 args: ArgsType = None, run: bool = True,
                 auto_configure_optimizers: bool = True, load_from_checkpoint_support: bool = True) -> None:
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.load_from_checkpoint_support = load_from_checkpoint_support  # hparams hold the parsed init args already
        self.model_class, self.datamodule_class = model_class, datamodule_class
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        try:
            self._parse(args, run)
            self.subcommand: str | None = self.config["subcommand"] if run else None
            self._set_seed()
            self.before_instantiate_classes()
            self.instantiate_classes()
            self.after_instantiate_classes()
        except CLIError as exc:
            self._exit_with_error(exc)
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # --- parsing --------------------------------------------------------------------------------------------
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Each subcommand and the Trainer method arguments the CLI fills itself (the rest come from the config)."""
        return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
                "validate": {"model", "dataloaders", "datamodule"},
                "test": {"model", "dataloaders", "datamodule"},
                "predict": {"model", "dataloaders", "datamodule"}}

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        return self.parser_class(**kwargs)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--seed_everything", default=self.seed_everything_default,
                            help="an int seeds everything before the classes are built; true picks a seed")

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self.model_class or TrainModule, "model",
                                        subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self.datamodule_class or DataModule, "data",
                                        subclass_mode=self.subclass_mode_data,
                                        required=self.datamodule_class is not None)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments, class groups, defaults and links to the parser."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser.optimizer_keys():
                parser.add_optimizer_args()
            if not parser.scheduler_keys():
                parser.add_lr_scheduler_args()

    def _parse(self, args: list[str] | dict[str, Any] | None, run: bool) -> None:
        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in self.subcommands()}
        argv = list(sys.argv[1:]) if args is None else args
        structured = argv if isinstance(argv, dict) else None
        tokens = [] if isinstance(argv, dict) else argv
        parsed = split_command_line(tokens, tuple(self.subcommands()) if run else None)
        if structured is not None and run:
            parsed.subcommand = structured.get("subcommand") or next((k for k in structured if k in
                                                                     self.subcommands()), None)
            if parsed.subcommand is None:
                raise CLIError(f"args: expected a subcommand key, one of {', '.join(self.subcommands())}")
            structured = structured.get(parsed.subcommand) or {}
        sub_kwargs = self.parser_kwargs.get(parsed.subcommand, {}) if parsed.subcommand else {}
        self.parser = self.init_parser(**{**main_kwargs, **sub_kwargs})
        self._add_arguments(self.parser)
        method = getattr(self.trainer_class, parsed.subcommand) if parsed.subcommand else None
        skip = self.subcommands()[parsed.subcommand] if parsed.subcommand else set()
        self.sources = ConfigSources()
        self._assembler = ConfigAssembler(self.parser, self.trainer_class, self.trainer_defaults, method, skip,
                                          self.sources)
        if parsed.help:
            print(self._assembler.help_text(parsed.subcommand, tuple(self.subcommands()) if run else None))
            raise SystemExit(0)
        config = self._assembler.assemble(parsed, structured)
        if parsed.print_config:
            print(OmegaConf.to_yaml(self._assembler.full_dump(config)), end="")
            raise SystemExit(0)
        self.config = OmegaConf.create({"subcommand": parsed.subcommand, parsed.subcommand: config} if run else config)

    def _exit_with_error(self, exc: CLIError) -> None:
        print(f"{sys.argv[0] or 'LightningCLI'}: error: {exc}", file=sys.stderr)
        raise SystemExit(2)

    # --- building -------------------------------------------------------------------------------------------
    def _section(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config

    def _plain_section(self) -> dict[str, Any]:
        return cast(dict[str, Any], OmegaConf.to_container(self._section(), resolve=True))

    def _set_seed(self) -> None:
        section = self._section()
        section["seed_everything"] = apply_seed(section.get("seed_everything"))

    def before_instantiate_classes(self) -> None:
        """Called after parsing, before anything is built."""

    def instantiate_classes(self) -> None:
        """Builds the data module, the model (with the automatic `configure_optimizers` when an optimizer is given)
        and the Trainer."""
        section = self._plain_section()
        self._instantiator = Instantiator(self.parser, self.trainer_class, ObjectBuilder(self.sources),
                                          self._assembler)
        self._built = self._instantiator.build_groups(section)
        self.config_init = {"subcommand": self.subcommand, self.subcommand: self._built} if self.subcommand \
            else self._built
        self.datamodule = self._built.get("data")
        self.model = self._built.get("model")
        if self.auto_configure_optimizers:
            self._instantiator.attach_optimizers(self.model, self._built, type(self).configure_optimizers)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Called after the classes are built, before the subcommand runs."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer from the `trainer` config (plus `kwargs`), with the callbacks of the class groups, the
        `trainer_defaults` callbacks and the config-saving callback."""
        config = {**self._built["trainer"], **kwargs}
        callbacks = config.get("callbacks")
        callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list) else [callbacks]
        callbacks += [self._built[key] for key in self.parser.callback_keys if self._built.get(key) is not None]
        extra = self.trainer_defaults.get("callbacks")
        if extra is not None:
            callbacks += extra if isinstance(extra, list) else [extra]
        if self.save_config_callback is not None and not config.get("fast_dev_run", False):
            dump = self._assembler.full_dump(self._plain_section())
            callbacks.append(self.save_config_callback(self.parser, OmegaConf.create(dump), **self.save_config_kwargs))
        config["callbacks"] = callbacks
        return self._instantiator.make_trainer(config)

    @staticmethod
    def configure_optimizers(lightning_module: TrainModule, optimizer: Any, lr_scheduler: Any = None) -> Any:
        """What the model's `configure_optimizers` returns when the optimizer comes from the config."""
        from trainer.cli.lightning_build import ReduceLROnPlateau

        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler,
                                                             "monitor": lr_scheduler.monitor}}
        return [optimizer], [lr_scheduler]

    # --- running --------------------------------------------------------------------------------------------
    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        fn = getattr(self, subcommand, None) or getattr(self.trainer, subcommand)
        kwargs = {k: v for k, v in self._built.items() if k in self._assembler.method_args}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        fn(**kwargs)
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()
