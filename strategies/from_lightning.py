"""Lightning 2.6.6's `lightning.pytorch.strategies` and `.plugins` names as `strategies` provides them, and the lookup
that the tables of `trainer` and `callbacks` use too (docs/from-lightning.md, "Every Lightning import").

A port renames `from lightning.pytorch.plugins.precision import MixedPrecision` to `from strategies import
MixedPrecision` (shared/API.md, the porting contract). A name with an equivalent here resolves to it on first use;
a name with none raises an ImportError that says what to use instead, while `hasattr(strategies, name)` stays False.
The tables are data: the objects are imported only when a name is asked for, so `import strategies` stays a leaf.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

# The class renames of the porting contract (shared/API.md): Lightning's name -> ours.
CLASS_RENAMES = {"LightningModule": "TrainModule", "LightningDataModule": "DataModule",
                 "TQDMProgressBar": "ProgressBar"}

SAME, RENAMED, EQUIVALENT, REFUSED = "same", "renamed", "equivalent", "refused"


class Row(NamedTuple):
    """One Lightning name: the Lightning modules that export it, and ours (`module`, empty when refused)."""

    lightning: tuple[str, ...]  # module paths under `lightning.pytorch` ("" is the package itself)
    module: str = ""  # the module of ours that defines the object
    attribute: str = ""  # its name there, when not Lightning's name
    note: str = ""  # how ours differs (a resolving row), or what to use instead (a refused one)


def same(module: str, *lightning: str) -> Row:
    """Ours has Lightning's name and meaning (the contract's class renames included)."""
    return Row(lightning, module)


def ours(module: str, attribute: str, note: str, *lightning: str) -> Row:
    """Ours does the job of Lightning's name; `note` says how it differs (`attribute`: ours' own name, if other)."""
    return Row(lightning, module, attribute, note)


def refused(note: str, *lightning: str) -> Row:
    """No counterpart here; `note` says what to use instead, or why there is none."""
    return Row(lightning, "", "", note)


def exported_name(lightning_name: str) -> str:
    """The name a port imports: Lightning's own, or the contract's rename."""
    return CLASS_RENAMES.get(lightning_name, lightning_name)


def status(name: str, row: Row) -> str:
    if not row.module:
        return REFUSED
    if row.note:
        return EQUIVALENT
    return RENAMED if exported_name(name) != name else SAME


def resolve(package: str, table: Mapping[str, Row], name: str) -> Any:
    """The object `package.name` stands for, for a package `__getattr__`.

    A name not in `table` is an AttributeError as usual; a refused one (or a Lightning name that the contract renames)
    is an ImportError under `from package import name`, where Python would otherwise replace the message with its own,
    and an AttributeError otherwise, so that `hasattr` and `getattr(package, name, None)` keep working."""
    row = table.get(name)
    if row is not None and row.module and exported_name(name) == name:
        return getattr(importlib.import_module(row.module), row.attribute or name)
    if row is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    if row.module:
        ours_name = exported_name(name)
        message = f"Lightning's {name} is called {ours_name} here: from {package} import {ours_name}"
    else:
        message = f"{row.note} (Lightning's {name} has no counterpart here; see docs/from-lightning.md)"
    if _caller_is_from_import(sys._getframe(2)):  # 0: here, 1: the package's __getattr__, 2: the code asking
        raise ImportError(f"cannot import name {name!r} from {package!r}: {message}", name=package)
    raise AttributeError(f"module {package!r} has no attribute {name!r}: {message}")


def _caller_is_from_import(frame: Any) -> bool:
    """Whether `frame` is running a `from ... import name` statement (an IMPORT_FROM instruction)."""
    import dis  # only on the way to an error

    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and dis.opname[code[frame.f_lasti]] == "IMPORT_FROM"


def package_lookups(package: str, tables: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package`, whose Lightning names are in the module `tables`
    (its `TABLES[package]`, or its `NAMES`): that module is imported on the first lookup, so importing the package
    stays cheap; a resolved name is set on the package, so later lookups are plain attribute reads."""

    def table() -> Mapping[str, Row]:
        module = importlib.import_module(tables)
        found: Mapping[str, Row] = module.TABLES[package] if hasattr(module, "TABLES") else module.NAMES
        return found

    def __getattr__(name: str) -> Any:  # called by Python as the package's own: `resolve` counts on that depth
        value = resolve(package, table(), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names_here(table())})

    return __getattr__, __dir__


def names_here(table: Mapping[str, Row]) -> list[str]:
    """The Lightning names that resolve (for a package's `__dir__`)."""
    return [name for name, row in table.items() if row.module and exported_name(name) == name]


_PLUGINS = "there is no Trainer(plugins=...): "
_IO = (_PLUGINS + "the strategy writes and reads checkpoints itself (atomic files, fsspec URLs, weights-only loads; "
       "docs/checkpointing.md)")
_ENV = (_PLUGINS + "the cluster is detected from the environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK), SLURM, or "
        "MASTER_ADDR/MASTER_PORT/NODE_RANK for a manual multi-node launch (docs/distributed.md)")
_XLA = "there is no TPU/XLA support here; train on CPU, CUDA or MPS"
_DEEPSPEED = "DeepSpeed is not used here: strategies.ZeroStrategy(stage=1, 2 or 3) shards the optimizer state, " \
             "gradients and parameters with torch's own ZeRO-1 and FSDP2"
_PRECISION_OBJECT = "pass it to a strategy's `precision=` (there is no Trainer(plugins=)); Trainer(precision=...) " \
                    "builds it from the flag"

NAMES: dict[str, Row] = {
    "Strategy": same("strategies.base", "strategies", "strategies.strategy"),
    "SingleDeviceStrategy": same("strategies.single_device", "strategies", "strategies.single_device"),
    "ParallelStrategy": same("strategies.parallel", "strategies", "strategies.parallel"),
    "DDPStrategy": ours("strategies.ddp", "", "the same keywords for process_group_backend, timeout, "
                        "find_unused_parameters and static_graph; start_method 'popen' is called 'subprocess'; no "
                        "DDP communication hooks or model averaging", "strategies", "strategies.ddp"),
    "FSDPStrategy": ours("strategies.fsdp", "", "FSDP2 (torch's fully_shard), not FSDP1: wrapping by "
                         "`shard_modules=` classes, `offload=`, `reshard_after_forward=` and `sharded_checkpoint=` in "
                         "place of auto_wrap_policy, cpu_offload, sharding_strategy and state_dict_type (also "
                         "strategy='zero3')", "strategies", "strategies.fsdp"),
    "DeepSpeedStrategy": refused(_DEEPSPEED, "strategies", "strategies.deepspeed"),
    "remove_module_hooks": refused(_DEEPSPEED, "strategies.deepspeed"),
    "ModelParallelStrategy": ours("strategies.model_parallel", "", "Lightning's arguments and mesh; parameters "
                                  "that configure_model leaves unsharded are averaged over the data-parallel ranks "
                                  "(Lightning leaves them unsynchronised), and 'auto' beside one given size is the "
                                  "world size divided by it (Lightning refuses)", "strategies",
                                  "strategies.model_parallel"),
    "SingleDeviceXLAStrategy": refused(_XLA, "strategies.single_xla"),
    "XLAStrategy": refused(_XLA, "strategies.xla"),
    "Precision": ours("strategies.precision", "", "the '32-true' base class; " + _PRECISION_OBJECT,
                      "plugins", "plugins.precision", "plugins.precision.precision"),
    "MixedPrecision": ours("strategies.precision", "", "MixedPrecision(precision, device_type, scaler) as Lightning's "
                           "(precision, device, scaler); " + _PRECISION_OBJECT,
                           "plugins", "plugins.precision", "plugins.precision.amp"),
    "HalfPrecision": ours("strategies.precision", "", _PRECISION_OBJECT,
                          "plugins", "plugins.precision", "plugins.precision.half"),
    "DoublePrecision": ours("strategies.precision", "", _PRECISION_OBJECT,
                            "plugins", "plugins.precision", "plugins.precision.double"),
    "LightningDoublePrecisionModule": refused("DoublePrecision casts the module itself; no wrapper module is needed",
                                              "plugins.precision.double"),
    "FSDPPrecision": refused("FSDPStrategy takes the ordinary precision (Trainer(precision='bf16-mixed')), which gives "
                             "FSDP2 its mixed-precision policy",
                             "plugins", "plugins.precision", "plugins.precision.fsdp"),
    "DeepSpeedPrecision": refused(_DEEPSPEED, "plugins", "plugins.precision", "plugins.precision.deepspeed"),
    "BitsandbytesPrecision": refused("bitsandbytes quantization is not provided: quantize the layers yourself "
                                     "(e.g. with bitsandbytes' own modules) in configure_model",
                                     "plugins", "plugins.precision", "plugins.precision.bitsandbytes"),
    "TransformerEnginePrecision": refused("Transformer Engine's FP8 is not provided: use precision='bf16-mixed', or "
                                          "build Transformer Engine layers yourself in configure_model",
                                          "plugins", "plugins.precision", "plugins.precision.transformer_engine"),
    "XLAPrecision": refused(_XLA, "plugins", "plugins.precision", "plugins.precision.xla"),
    "CheckpointIO": refused(_IO, "plugins", "plugins.io", "plugins.io.checkpoint_plugin"),
    "TorchCheckpointIO": refused(_IO, "plugins", "plugins.io", "plugins.io.torch_plugin"),
    "AsyncCheckpointIO": refused(_IO + "; FSDPStrategy(sharded_checkpoint='async') saves in the background",
                                 "plugins", "plugins.io", "plugins.io.async_plugin"),
    "XLACheckpointIO": refused(_XLA, "plugins", "plugins.io", "plugins.io.xla_plugin"),
    "LayerSync": refused("use Trainer(sync_batchnorm=True), which converts BatchNorm layers to torch's "
                         "SyncBatchNorm", "plugins", "plugins.layer_sync"),
    "TorchSyncBatchNorm": refused("use Trainer(sync_batchnorm=True), which converts BatchNorm layers to torch's "
                                  "SyncBatchNorm", "plugins", "plugins.layer_sync"),
    "ClusterEnvironment": refused(_ENV, "plugins.environments"),
    "LightningEnvironment": refused(_ENV, "plugins.environments"),
    "TorchElasticEnvironment": refused(_ENV, "plugins.environments"),
    "SLURMEnvironment": refused(_ENV + "; under SLURM, SIGUSR1 saves a checkpoint and requeues the job",
                                "plugins.environments"),
    "KubeflowEnvironment": refused(_ENV + "; start the ranks with torchrun", "plugins.environments"),
    "LSFEnvironment": refused(_ENV + "; start the ranks with torchrun", "plugins.environments"),
    "MPIEnvironment": refused(_ENV + "; start the ranks with torchrun", "plugins.environments"),
    "XLAEnvironment": refused(_XLA, "plugins.environments"),
}
