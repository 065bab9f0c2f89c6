"""Lightning 2.6.6's public names as `trainer` and its public subpackages provide them (docs/from-lightning.md,
"Every Lightning import"): `lightning.pytorch`, `.core`, `.trainer` and `.utilities` names from `trainer`; `.loggers`,
`.tuner`, `.profilers` and `.cli` names from `trainer.loggers`, `trainer.tuner`, `trainer.profilers`, `trainer.cli`.

Data only: each package's `__getattr__` looks a name up here on first use (strategies/from_lightning.py has the
lookup), so `import trainer` imports none of the objects. `python -m trainer.from_lightning` prints the table of
docs/from-lightning.md from these rows and those of `callbacks` and `strategies` (`--write docs/from-lightning.md`
rewrites it there).
"""

from __future__ import annotations

import sys
from collections import Counter

from strategies.from_lightning import (
    EQUIVALENT,
    REFUSED,
    RENAMED,
    SAME,
    Row,
    exported_name,
    ours,
    refused,
    same,
    status,
)

_DEEPSPEED = "DeepSpeed is not used here (strategies.ZeroStrategy); `python -m trainer consolidate` turns a sharded " \
             "checkpoint into one file"
_SUMMARY = "callbacks.model_summary has the summary: summary_of(model, max_depth) for the data (SummaryData), " \
           "summarize(model, max_depth) for the text"
_SAVE_HPARAMS = "what save_hyperparameters does inside: call obj.save_hyperparameters() on a TrainModule, DataModule " \
                "or any HyperparametersMixin"
_CHECKPOINT_IO = "Lightning 2.x checkpoints load directly (load_from_checkpoint, fit(ckpt_path=...)): see " \
                 "\"Hyperparameters and checkpoints\"; upgrade a 1.x checkpoint with Lightning's own tool first"
_TUNER = "the Tuner finds `lr`/`learning_rate` and the batch size on the module, its hparams or the DataModule " \
         "by itself"

TRAINER: dict[str, Row] = {
    "Trainer": same("trainer.trainer", "", "trainer", "trainer.trainer"),
    "LightningModule": same("trainer.core.module", "", "core", "core.module"),
    "LightningDataModule": same("trainer.core.datamodule", "", "core", "core.datamodule"),
    "Callback": same("callbacks.base", ""),
    "seed_everything": same("trainer.seed", "", "trainer"),
    "TrainerFn": same("trainer.state", "trainer.states"),
    "RunningStage": same("trainer.state", "trainer.states"),
    "TrainerStatus": same("trainer.state", "trainer.states"),
    "TrainerState": same("trainer.state", "trainer.states"),
    "HyperparametersMixin": same("trainer.core.hparams", "core.mixins", "core.mixins.hparams_mixin"),
    "DataHooks": ours("trainer.core.data_hooks", "", "the loader hooks, prepare_data and the batch-transfer hooks; "
                      "setup and teardown are TrainModule's and DataModule's own", "core.hooks"),
    "ModelHooks": refused("TrainModule defines every hook itself: subclass it", "core.hooks"),
    "CheckpointHooks": refused("TrainModule, DataModule and Callback define on_save_checkpoint and "
                               "on_load_checkpoint themselves", "core.hooks"),
    "LightningOptimizer": ours("strategies.model.wrapped_optimizer", "StrategyOptimizer", "what self.optimizers() "
                               "returns, an instance of your optimizer's class too; LightningOptimizer(optimizer) "
                               "builds one by hand, whose step is the optimizer's own; no toggle_model()",
                               "core.optimizer"),
    "do_nothing_closure": refused("optimizer.step() needs no closure here: call it without one", "core.optimizer"),
    "MODULE_OPTIMIZERS": same("trainer.core.hook_types", "core.module"),
    "CHECKPOINT_PAST_HPARAMS_KEYS": refused("checkpoints hold hyperparameters under `hyper_parameters`; "
                                            + _CHECKPOINT_IO, "core.saving"),
    "convert": refused("tags.csv values are read as Python literals by trainer.load_hparams_from_tags_csv",
                       "core.saving"),
    "load_hparams_from_tags_csv": ours("trainer.core.hparams_storage", "read_hparams_file", "reads a .csv or a "
                                       ".yaml by its suffix; a missing file is an error", "core.saving"),
    "load_hparams_from_yaml": ours("trainer.core.hparams_storage", "read_hparams_file", "a plain dict read with "
                                   "YAML's safe loader, never an OmegaConf DictConfig; a missing file is an error, "
                                   "not an empty dict and a warning", "core.saving"),
    "save_hparams_to_tags_csv": refused("write hparams.yaml with trainer.save_hparams_to_yaml(path, hparams); "
                                        "load_from_checkpoint(hparams_file=...) reads both forms", "core.saving"),
    "save_hparams_to_yaml": same("trainer.core.hparams_storage", "core.saving"),
    "update_hparams": refused("update the dict yourself (`hparams.update(...)`)", "core.saving"),
    "AttributeDict": same("trainer.core.data_hooks", "utilities", "utilities.parsing"),
    "CombinedLoader": same("trainer.data.combined_loader", "utilities", "utilities.combined_loader"),
    "GradClipAlgorithmType": same("trainer.core.gradients", "utilities", "utilities.enums"),
    "LightningEnum": same("trainer.state", "utilities"),
    "grad_norm": same("trainer.core.gradients", "utilities", "utilities.grads"),
    "measure_flops": same("callbacks.throughput_monitor", "utilities"),
    "find_shared_parameters": same("strategies.model.parameter_tying", "utilities", "utilities.parameter_tying"),
    "set_shared_parameters": same("strategies.model.parameter_tying", "utilities", "utilities.parameter_tying"),
    "is_picklable": same("trainer.core.hparams_storage", "utilities", "utilities.parsing"),
    "is_shared_filesystem": refused("checkpoints are written by rank 0, sharded ones by every rank into one folder "
                                    "that must be shared; there is no check of the file system", "utilities"),
    "move_data_to_device": same("strategies.model.device_move", "utilities"),
    "suggested_max_num_workers": same("trainer.data.loaders", "utilities"),
    "disable_possible_user_warnings": same("strategies.comm.distributed", "utilities"),
    "PossibleUserWarning": same("strategies.exceptions", "utilities.warnings"),
    "rank_zero_only": same("strategies.comm.distributed", "utilities", "utilities.rank_zero"),
    "rank_zero_info": ours("strategies.comm.distributed", "", "prints the message (Lightning logs it at INFO level)",
                           "utilities", "utilities.rank_zero"),
    "rank_zero_warn": same("strategies.comm.distributed", "utilities", "utilities.rank_zero"),
    "rank_zero_deprecation": same("strategies.comm.distributed", "utilities", "utilities.rank_zero"),
    "rank_zero_debug": same("strategies.comm.distributed", "utilities.rank_zero"),
    "rank_prefixed_message": same("strategies.comm.distributed", "utilities.rank_zero"),
    "WarningCache": same("strategies.comm.distributed", "utilities.rank_zero"),
    "LightningDeprecationWarning": same("strategies.exceptions", "utilities.rank_zero"),
    "MisconfigurationException": ours("strategies.exceptions", "", "the base of ConfigError and MisconfigurationError, "
                                      "what this project raises for a refused setting (and a TrainerError)",
                                      "utilities.exceptions"),
    "SIGTERMException": same("trainer.ranks.preemption", "utilities.exceptions"),
    "isolate_rng": same("trainer.seed", "utilities.seed"),
    "is_overridden": same("trainer.core.overrides", "utilities.model_helpers"),
    "get_torchvision_model": refused("call torchvision.models.get_model(name, **kwargs)", "utilities.model_helpers"),
    "from_compiled": refused("pass the torch.compile'd module to the Trainer as it is: it compiles the module's "
                             "forward itself (docs/compile.md)", "utilities.compile"),
    "to_uncompiled": refused("the Trainer unwraps a torch.compile'd module itself; the module is `compiled._orig_mod`",
                             "utilities.compile"),
    "BType": refused("annotate a batch as Any", "utilities.data"),
    "extract_batch_size": ours("trainer.metrics.results", "", "the size of dim 0 of the first tensor found, None when "
                               "there is none (Lightning raises)", "utilities.data"),
    "has_len_all_ranks": refused("len(loader), and trainer.num_training_batches / num_val_batches for what a run "
                                 "uses", "utilities.data"),
    "CPU_DEVICE": refused(_DEEPSPEED, "utilities.deepspeed"),
    "convert_zero_checkpoint_to_fp32_state_dict": refused(_DEEPSPEED, "utilities.deepspeed"),
    "ds_checkpoint_dir": refused(_DEEPSPEED, "utilities.deepspeed"),
    "is_oom_error": same("trainer.tuner.batch_size_scaling", "utilities.memory"),
    "garbage_collection_cuda": ours("trainer.tuner.batch_size_scaling", "free_memory", "also runs Python's garbage "
                                    "collector", "utilities.memory"),
    "is_cuda_out_of_memory": same("trainer.tuner.batch_size_scaling", "utilities.memory"),
    "is_cudnn_snafu": same("trainer.tuner.batch_size_scaling", "utilities.memory"),
    "is_out_of_cpu_memory": same("trainer.tuner.batch_size_scaling", "utilities.memory"),
    "recursive_detach": same("strategies.model.device_move", "utilities.memory"),
    "migrate_checkpoint": refused(_CHECKPOINT_IO, "utilities.migration", "utilities.migration.utils"),
    "pl_legacy_patch": refused(_CHECKPOINT_IO, "utilities.migration", "utilities.migration.utils"),
    "main": refused(_CHECKPOINT_IO, "utilities.upgrade_checkpoint"),
    "download_model_from_registry": refused("there is no model registry: download the checkpoint yourself and load it "
                                            "(fsspec URLs work as paths)", "utilities.model_registry"),
    "find_model_local_ckpt_path": refused("there is no model registry: pass the checkpoint's path",
                                          "utilities.model_registry"),
    "ModelSummary": refused(_SUMMARY, "utilities.model_summary", "utilities.model_summary.model_summary"),
    "LayerSummary": refused(_SUMMARY, "utilities.model_summary", "utilities.model_summary.model_summary"),
    "summarize": ours("callbacks.model_summary", "", "returns the table as text (Lightning returns a ModelSummary "
                      "object); summary_of(model, max_depth) returns the data", "utilities.model_summary",
                      "utilities.model_summary.model_summary"),
    "get_human_readable_count": ours("callbacks.model_summary", "human_count", "", "utilities.model_summary",
                                     "utilities.model_summary.model_summary"),
    "get_formatted_model_size": refused(_SUMMARY, "utilities.model_summary", "utilities.model_summary.model_summary"),
    "parse_batch_shape": refused(_SUMMARY, "utilities.model_summary", "utilities.model_summary.model_summary"),
    "LEFTOVER_PARAMS_NAME": refused(_SUMMARY, "utilities.model_summary.model_summary"),
    "NOT_APPLICABLE": refused(_SUMMARY, "utilities.model_summary.model_summary"),
    "PARAMETER_NUM_UNITS": refused(_SUMMARY, "utilities.model_summary.model_summary"),
    "UNKNOWN_SIZE": refused(_SUMMARY, "utilities.model_summary.model_summary"),
    "DeepSpeedSummary": refused(_DEEPSPEED, "utilities.model_summary",
                                "utilities.model_summary.model_summary_deepspeed"),
    "DeepSpeedLayerSummary": refused(_DEEPSPEED, "utilities.model_summary.model_summary_deepspeed"),
    "deepspeed_param_size": refused(_DEEPSPEED, "utilities.model_summary.model_summary_deepspeed"),
    "clean_namespace": refused(_SAVE_HPARAMS, "utilities.parsing"),
    "collect_init_args": refused(_SAVE_HPARAMS, "utilities.parsing"),
    "get_init_args": refused(_SAVE_HPARAMS, "utilities.parsing"),
    "parse_class_init_keys": refused(_SAVE_HPARAMS, "utilities.parsing"),
    "save_hyperparameters": refused(_SAVE_HPARAMS, "utilities.parsing"),
    "lightning_getattr": refused(_TUNER, "utilities.parsing"),
    "lightning_hasattr": refused(_TUNER, "utilities.parsing"),
    "lightning_setattr": refused(_TUNER, "utilities.parsing"),
    "is_param_in_hook_signature": refused("the Trainer reads the step methods' signatures itself (a step may leave "
                                          "out batch_idx, as in Lightning)", "utilities.signature_utils"),
    "STEP_OUTPUT": same("trainer.core.hook_types", "utilities.types"),
    "TRAIN_DATALOADERS": same("trainer.core.hook_types", "utilities.types"),
    "EVAL_DATALOADERS": same("trainer.core.hook_types", "utilities.types"),
    "OptimizerLRScheduler": same("trainer.core.hook_types", "utilities.types"),
    "OptimizerConfig": same("trainer.core.hook_types", "utilities.types"),
    "OptimizerLRSchedulerConfig": same("trainer.core.hook_types", "utilities.types"),
    "LRSchedulerConfigType": same("trainer.core.hook_types", "utilities.types"),
    "LRSchedulerTypeTuple": same("trainer.core.hook_types", "utilities.types"),
    "LRSchedulerTypeUnion": same("trainer.core.hook_types", "utilities.types"),
    "LRSchedulerType": same("trainer.core.hook_types", "utilities.types"),
    "LRSchedulerPLType": same("trainer.core.hook_types", "utilities.types"),
    "LRSchedulerConfig": ours("trainer.core.optimizer_setup", "SchedulerConfig", "the same fields, in another "
                              "positional order (scheduler, interval, frequency, monitor, strict, name, "
                              "reduce_on_plateau); reduce_on_plateau=None means: when the scheduler is a "
                              "ReduceLROnPlateau", "utilities.types"),
    "DistributedDataParallel": ours("torch.nn.parallel", "", "torch's class itself (Lightning's is a Protocol of it)",
                                    "utilities.types"),
}

_LOGGER = "use TensorBoardLogger, CSVLogger, MLFlowLogger or WandbLogger, or subclass trainer.loggers.Logger " \
          "(name, version, log_metrics, log_hyperparams)"

LOGGERS: dict[str, Row] = {
    "Logger": same("trainer.loggers.base", "loggers", "loggers.logger"),
    "CSVLogger": same("trainer.loggers.csv", "loggers", "loggers.csv_logs"),
    "TensorBoardLogger": same("trainer.loggers.tensorboard", "loggers", "loggers.tensorboard"),
    "MLFlowLogger": same("trainer.loggers.mlflow", "loggers", "loggers.mlflow"),
    "WandbLogger": same("trainer.loggers.wandb", "loggers", "loggers.wandb"),
    "CometLogger": refused(_LOGGER, "loggers", "loggers.comet"),
    "comet_experiment": refused(_LOGGER, "loggers.comet"),
    "FRAMEWORK_NAME": refused(_LOGGER, "loggers.comet"),
    "LitLogger": refused(_LOGGER, "loggers", "loggers.litlogger"),
    "NeptuneLogger": refused(_LOGGER, "loggers.neptune"),
    "ExperimentWriter": same("trainer.loggers.csv", "loggers.csv_logs"),
    "DummyLogger": same("trainer.loggers.base", "loggers.logger"),
    "merge_dicts": refused("merge the dicts yourself (Lightning's helper of its removed LoggerCollection)",
                           "loggers.logger"),
    "rank_zero_experiment": refused("a Logger subclass's writing methods run on rank 0 only by themselves",
                                    "loggers.logger"),
    "LOCAL_FILE_URI_PREFIX": refused("MLFlowLogger takes a local folder or a `file:` URI as tracking_uri",
                                     "loggers.mlflow"),
}

PROFILERS: dict[str, Row] = {
    "Profiler": same("trainer.profilers.base", "profilers", "profilers.profiler"),
    "PassThroughProfiler": same("trainer.profilers.base", "profilers", "profilers.base"),
    "SimpleProfiler": same("trainer.profilers.simple", "profilers", "profilers.simple"),
    "AdvancedProfiler": same("trainer.profilers.advanced", "profilers", "profilers.advanced"),
    "PyTorchProfiler": same("trainer.profilers.pytorch", "profilers", "profilers.pytorch"),
    "XLAProfiler": refused("there is no TPU/XLA support here", "profilers", "profilers.xla"),
    "RegisterRecordFunction": refused("PyTorchProfiler records each module's forward itself", "profilers.pytorch"),
    "ScheduleWrapper": refused("pass torch.profiler.schedule(...) to PyTorchProfiler(schedule=...)",
                               "profilers.pytorch"),
}

TUNER: dict[str, Row] = {"Tuner": same("trainer.tuner.tuning", "tuner", "tuner.tuning")}

_INJECTION = "the CLI here does not inject optimizer or scheduler factories into the model: build them in " \
             "configure_optimizers, or give `--optimizer` / `--lr_scheduler` (docs/cli.md)"

CLI: dict[str, Row] = {
    "LightningCLI": same("trainer.cli.lightning_cli", "cli"),
    "LightningArgumentParser": same("trainer.cli.lightning_parser", "cli"),
    "SaveConfigCallback": same("trainer.cli.lightning_cli", "cli"),
    "ReduceLROnPlateau": same("trainer.cli.lightning_build", "cli"),
    "ArgsType": ours("trainer.cli.lightning_cli", "", "a list of strings or a dict (no argparse Namespace)", "cli"),
    "LRSchedulerTypeTuple": same("trainer.core.hook_types", "cli"),
    "LRSchedulerTypeUnion": same("trainer.core.hook_types", "cli"),
    "LRSchedulerType": same("trainer.core.hook_types", "cli"),
    "OptimizerCallable": refused(_INJECTION, "cli"),
    "LRSchedulerCallable": refused(_INJECTION, "cli"),
    "instantiate_class": same("trainer.cli.lightning_instantiate", "cli"),
    "instantiate_module": refused("build the module from its config yourself: cls(**config['init_args'])", "cli"),
}

TABLES: dict[str, dict[str, Row]] = {"trainer": TRAINER, "trainer.loggers": LOGGERS, "trainer.tuner": TUNER,
                                     "trainer.profilers": PROFILERS, "trainer.cli": CLI}


def all_tables() -> dict[str, dict[str, Row]]:
    """Every package's table: `trainer`'s, its subpackages', `callbacks`' and `strategies`'."""
    from callbacks.from_lightning import NAMES as CALLBACKS
    from strategies.from_lightning import NAMES as STRATEGIES

    return {**TABLES, "callbacks": CALLBACKS, "strategies": STRATEGIES}


def _lightning_paths(name: str, row: Row) -> str:
    return "<br>".join(f"`{'.'.join(['lightning.pytorch', *([module] if module else []), name])}`"
                       for module in row.lightning)


def _ours(package: str, name: str, row: Row) -> str:
    """`package.Name`, and what it is when that is another name of ours or not ours at all."""
    if not row.module:
        return ""
    where = f"`{package}.{exported_name(name)}`"
    if row.attribute or not row.module.startswith(("trainer", "callbacks", "strategies")):
        return f"{where} (`{row.module}.{row.attribute or name}`)"
    return where


def markdown_table() -> str:
    """The table of docs/from-lightning.md: a line of counts, then one row per Lightning name and package, sorted by
    Lightning path."""
    rows = [(row.lightning[0], name, package, row) for package, table in all_tables().items()
            for name, row in table.items()]
    counts = Counter(status(name, row) for _, name, _, row in rows)
    lines = [f"{len(rows)} names ({sum(len(row.lightning) for *_, row in rows)} Lightning paths): {counts[SAME]} "
             f"same, {counts[RENAMED]} renamed, {counts[EQUIVALENT]} equivalent, {counts[REFUSED]} refused.", "",
             "| Lightning 2.6.6 | here | status | note |", "| --- | --- | --- | --- |"]
    for _, name, package, row in sorted(rows, key=lambda r: (r[0], r[1])):
        lines.append(f"| {_lightning_paths(name, row)} | {_ours(package, name, row)} | {status(name, row)} | "
                     f"{row.note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


BEGIN = "<!-- generated by `python -m trainer.from_lightning --write docs/from-lightning.md`: do not edit -->\n"
END = "<!-- end of the generated table -->\n"


def write_docs(path: str) -> None:
    """Replace the generated block of `path` (between BEGIN and END) with `markdown_table()`."""
    with open(path) as handle:
        text = handle.read()
    if BEGIN not in text or END not in text.partition(BEGIN)[2]:
        raise SystemExit(f"{path} has no generated block (the lines {BEGIN.strip()} and {END.strip()})")
    head, _, rest = text.partition(BEGIN)
    tail = rest.partition(END)[2]
    with open(path, "w") as handle:
        handle.write(head + BEGIN + markdown_table() + END + tail)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write_docs(sys.argv[2])
    else:
        sys.stdout.write(markdown_table())
