"""The public names of Lightning 2.6.6's LightningModule, LightningDataModule and Callback, as data: for each, whether
the Trainer calls it (a hook) or the user calls or sets it (a method or attribute), and what this project does with
it. The names were read from Lightning's classes (tests/compat/test_lightning_names.py checks the tables against an
installed Lightning); no Lightning code is copied.

Statuses:
- "supported": implemented with Lightning's meaning (docs/from-lightning.md names each test).
- "refused": not provided; defining such a hook is an error at the start of a run, calling such a method raises,
  and the note says what to do instead.
"""

from __future__ import annotations

from typing import NamedTuple

SUPPORTED = "supported"
REFUSED = "refused"

HOOK = "hook"  # the Trainer calls it: a definition it would not call must be refused
METHOD = "method"  # the user calls it or sets it (a method, property, attribute or constant)


class Name(NamedTuple):
    kind: str
    status: str
    note: str = ""


_S_HOOK, _S_METHOD = Name(HOOK, SUPPORTED), Name(METHOD, SUPPORTED)

_REMOVED_IN_2_0 = "removed in Lightning 2.0 (Lightning refuses it too): use `on_{}_epoch_end` and keep the step " \
                  "outputs you need in a list on `self`"

MODULE_NAMES: dict[str, Name] = {
    **dict.fromkeys(("CHECKPOINT_HYPER_PARAMS_KEY", "CHECKPOINT_HYPER_PARAMS_NAME", "CHECKPOINT_HYPER_PARAMS_TYPE",
                     "hparams_initial", "load_from_checkpoint", "remove_ignored_hparams", "save_hyperparameters",
                     "strict_loading"), _S_METHOD),
    **dict.fromkeys(("backward", "configure_gradient_clipping", "lr_scheduler_step", "optimizer_step",
                     "optimizer_zero_grad"), _S_HOOK),
    **dict.fromkeys(("manual_backward", "optimizers", "toggle_optimizer", "toggled_optimizer",
                     "untoggle_optimizer"), _S_METHOD),
    **dict.fromkeys(("all_gather", "automatic_optimization", "clip_gradients", "current_epoch", "device",
                     "device_mesh", "dtype", "example_input_array", "freeze", "global_rank", "global_step", "hparams",
                     "local_rank", "log", "log_dict", "logger", "loggers", "lr_schedulers", "on_gpu", "print",
                     "to_onnx", "trainer", "unfreeze"), _S_METHOD),
    **dict.fromkeys(("configure_callbacks", "configure_model", "configure_optimizers", "on_after_backward",
                     "on_after_batch_transfer", "on_before_backward", "on_before_batch_transfer",
                     "on_before_optimizer_step", "on_before_zero_grad", "on_fit_end", "on_fit_start",
                     "on_load_checkpoint", "on_predict_batch_end", "on_predict_batch_start", "on_predict_end",
                     "on_predict_epoch_end", "on_predict_epoch_start", "on_predict_model_eval", "on_predict_start",
                     "on_save_checkpoint", "on_test_batch_end", "on_test_batch_start", "on_test_end",
                     "on_test_epoch_end", "on_test_epoch_start", "on_test_model_eval", "on_test_model_train",
                     "on_test_start", "on_train_batch_end", "on_train_batch_start", "on_train_end",
                     "on_train_epoch_end", "on_train_epoch_start", "on_train_start", "on_validation_batch_end",
                     "on_validation_batch_start", "on_validation_end", "on_validation_epoch_end",
                     "on_validation_epoch_start", "on_validation_model_eval", "on_validation_model_train",
                     "on_validation_model_zero_grad", "on_validation_start", "predict_dataloader", "predict_step",
                     "prepare_data", "setup", "teardown", "test_dataloader", "test_step", "train_dataloader",
                     "training_step", "transfer_batch_to_device", "val_dataloader", "validation_step"), _S_HOOK),
    "configure_sharded_model": Name(HOOK, REFUSED, "deprecated in Lightning 2.1 in favour of `configure_model`: "
                                                   "rename the method to configure_model"),
    "fabric": Name(METHOD, REFUSED, "set only when Lightning Fabric runs the module; there is no Fabric here"),
    "to_tensorrt": Name(METHOD, REFUSED, "compile with torch_tensorrt.compile(model, inputs=[...]) directly"),
    "to_torchscript": Name(METHOD, REFUSED, "TorchScript is deprecated in PyTorch: use torch.export.export(model, "
                                            "(x,)) or model.to_onnx(path, x)"),
}

_STEP_END = ("removed in Lightning 2.0 (Lightning 2.x ignores it): do this work at the end of `{}_step` itself (under "
             "strategy='dp' the step's outputs are already gathered from every GPU when the loss is used)")
_SILENT_1X = "a Lightning 1.x hook that Lightning 2.x no longer calls (nor do we): {}"

# Names Lightning 1.x had and 2.x removed. Lightning 2.x raises for the `*_epoch_end` ones and silently ignores the
# others; we refuse them all, so that code ported from 1.x never loses what such a hook did without a word.
REMOVED_MODULE_NAMES: dict[str, Name] = {
    "training_epoch_end": Name(HOOK, REFUSED, _REMOVED_IN_2_0.format("train")),
    "validation_epoch_end": Name(HOOK, REFUSED, _REMOVED_IN_2_0.format("validation")),
    "test_epoch_end": Name(HOOK, REFUSED, _REMOVED_IN_2_0.format("test")),
    "training_step_end": Name(HOOK, REFUSED, _STEP_END.format("training")),
    "validation_step_end": Name(HOOK, REFUSED, _STEP_END.format("validation")),
    "test_step_end": Name(HOOK, REFUSED, _STEP_END.format("test")),
    "on_epoch_start": Name(HOOK, REFUSED, _SILENT_1X.format("use on_train_epoch_start (or the validation/test one)")),
    "on_epoch_end": Name(HOOK, REFUSED, _SILENT_1X.format("use on_train_epoch_end (or the validation/test one)")),
    "on_pretrain_routine_start": Name(HOOK, REFUSED, _SILENT_1X.format("use on_fit_start")),
    "on_pretrain_routine_end": Name(HOOK, REFUSED, _SILENT_1X.format("use on_fit_start")),
    "on_hpc_save": Name(HOOK, REFUSED, _SILENT_1X.format("use on_save_checkpoint")),
    "on_hpc_load": Name(HOOK, REFUSED, _SILENT_1X.format("use on_load_checkpoint")),
    "get_progress_bar_dict": Name(HOOK, REFUSED, _SILENT_1X.format("log with self.log(..., prog_bar=True)")),
}

REMOVED_CALLBACK_NAMES: dict[str, Name] = {
    "on_init_start": Name(HOOK, REFUSED, _SILENT_1X.format("do it in the callback's __init__")),
    "on_init_end": Name(HOOK, REFUSED, _SILENT_1X.format("use setup(trainer, pl_module, stage)")),
    "on_epoch_start": Name(HOOK, REFUSED, _SILENT_1X.format("use on_train_epoch_start (or the validation/test one)")),
    "on_epoch_end": Name(HOOK, REFUSED, _SILENT_1X.format("use on_train_epoch_end (or the validation/test one)")),
    "on_batch_start": Name(HOOK, REFUSED, _SILENT_1X.format("use on_train_batch_start")),
    "on_batch_end": Name(HOOK, REFUSED, _SILENT_1X.format("use on_train_batch_end")),
    "on_keyboard_interrupt": Name(HOOK, REFUSED, _SILENT_1X.format(
        "use on_exception and check isinstance(exception, KeyboardInterrupt)")),
    "on_pretrain_routine_start": Name(HOOK, REFUSED, _SILENT_1X.format("use on_fit_start")),
    "on_pretrain_routine_end": Name(HOOK, REFUSED, _SILENT_1X.format("use on_fit_start")),
    "on_configure_sharded_model": Name(HOOK, REFUSED, _SILENT_1X.format("use setup(trainer, pl_module, stage)")),
    "on_before_accelerator_backend_setup": Name(HOOK, REFUSED, _SILENT_1X.format(
        "use setup(trainer, pl_module, stage)")),
}

DATAMODULE_NAMES: dict[str, Name] = {
    **dict.fromkeys(("CHECKPOINT_HYPER_PARAMS_KEY", "CHECKPOINT_HYPER_PARAMS_NAME", "CHECKPOINT_HYPER_PARAMS_TYPE",
                     "hparams_initial", "load_from_checkpoint", "remove_ignored_hparams", "save_hyperparameters"),
                    _S_METHOD),
    **dict.fromkeys(("from_datasets", "hparams", "name"), _S_METHOD),
    **dict.fromkeys(("load_state_dict", "on_after_batch_transfer", "on_before_batch_transfer", "on_exception",
                     "predict_dataloader", "prepare_data", "setup", "state_dict", "teardown", "test_dataloader",
                     "train_dataloader", "transfer_batch_to_device", "val_dataloader"), _S_HOOK),
}

CALLBACK_NAMES: dict[str, Name] = {
    "state_key": _S_METHOD,
    **dict.fromkeys(("load_state_dict", "on_after_backward", "on_before_backward", "on_before_optimizer_step",
                     "on_before_zero_grad", "on_exception", "on_fit_end", "on_fit_start", "on_load_checkpoint",
                     "on_predict_batch_end", "on_predict_batch_start", "on_predict_end", "on_predict_epoch_end",
                     "on_predict_epoch_start", "on_predict_start", "on_sanity_check_end", "on_sanity_check_start",
                     "on_save_checkpoint", "on_test_batch_end", "on_test_batch_start", "on_test_end",
                     "on_test_epoch_end", "on_test_epoch_start", "on_test_start", "on_train_batch_end",
                     "on_train_batch_start", "on_train_end", "on_train_epoch_end", "on_train_epoch_start",
                     "on_train_start", "on_validation_batch_end", "on_validation_batch_start", "on_validation_end",
                     "on_validation_epoch_end", "on_validation_epoch_start", "on_validation_start", "setup",
                     "state_dict", "teardown"), _S_HOOK),
}
