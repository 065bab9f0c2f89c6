"""The Trainer: stores flags as a RunSpec, runs fit / validate / test / predict, exposes run state.

It never asks which strategy it has: everything that differs is behind `self.strategy`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_io.atomic_file import remove_stale_temp_files
from strategies.exceptions import ConfigError, MisconfigurationError
from strategies.model.compiled import unwrap_compiled
from trainer.checkpoint import schema as ckpt
from trainer.checkpoint.ckpt_path import check_weights_only, default_ckpt_path, resolve_ckpt_path
from trainer.checkpoint.loop_position import LoopPosition, Phase
from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule
from trainer.hooks import (
    DATAMODULE,
    HookDispatcher,
    call_hook,
    profiled_method,
)
from trainer.loops import evaluation_loop
from trainer.loops import fit_loop as loops
from trainer.loops.fit_state import FitState
from trainer.loops.schedule import FitSchedule
from trainer.metrics.results import ResultCollection
from trainer.metrics.results_table import print_results
from trainer.metrics.routing import MetricsRouter
from trainer.profilers import build_profiler
from trainer.properties import TrainerProperties
from trainer.ranks import failure
from trainer.ranks.agreement import ControlPlane
from trainer.ranks.preemption import StopSignals
from trainer.ranks.rank_result import pack_if_child
from trainer.run_properties import RunProperties
from trainer.seed import apply_cudnn_benchmark, enable_determinism
from trainer.setup import run_start
from trainer.setup.barebones import announce_start, apply_barebones
from trainer.setup.defaults import agree_logger_versions, build_callbacks, build_loggers
from trainer.setup.flags import FLAG_NAMES, parse_flags
from trainer.setup.optimization import setup_optimization
from trainer.state import Progress, RunningStage, TrainerFn, TrainerState, TrainerStatus


class Trainer(TrainerProperties, RunProperties):
    """Trains a TrainModule. Arguments and defaults follow PyTorch Lightning 2.x (see docs/index.md).

    Every flag is checked when the Trainer is built (a `ConfigError` names the flag and the accepted values);
    nothing starts a process or touches a device before `fit`, `validate`, `test` or `predict`.
    The flags are described in one table in docs/index.md; the distributed ones in docs/distributed.md.

    Attributes:
        strategy: the Strategy instance that owns devices, wrapping, collectives and checkpoint I/O.
        state: the TrainerState: which entry point runs (`fn`), its `status` and the current `stage`.
        loggers: the loggers in use (an empty list with `logger=False`).
        callbacks: the callbacks in use, the default ones (checkpoint, progress bar, summary) included.
        datamodule: the DataModule of the current run, or None.
        fit_state: the loops' own state (progress counters, results in use, loaders, optimizers, ...), for
            advanced use; the Trainer's properties are the stable way to read it.

    Example:
        ```python
        trainer = Trainer(max_epochs=5, accelerator="cpu", devices=2)   # 2 processes, DDP over gloo
        trainer.fit(model, datamodule=data)
        trainer.test(model, datamodule=data)
        ```
    """

    def __init__(
        self,
        *,
        accelerator: str = "auto",
        devices: Any = "auto",
        gpus: Any = None,
        num_nodes: int = 1,
        strategy: Any = "auto",
        precision: Any = "32-true",
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: Any = None,
        limit_train_batches: int | float | None = 1.0,
        limit_val_batches: int | float | None = 1.0,
        limit_test_batches: int | float | None = 1.0,
        limit_predict_batches: int | float | None = 1.0,
        overfit_batches: int | float = 0.0,
        val_check_interval: int | float | str | timedelta | dict[str, int] | None = 1.0,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        callbacks: Any = None,
        logger: Any = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        default_root_dir: str | Path | None = None,
        deterministic: bool | str | None = False,
        fast_dev_run: bool | int = False,
        use_distributed_sampler: bool = True,
        detect_anomaly: bool = False,
        profiler: Any = None,
        terminate_on_nan: bool = False,
        agree_every_n_steps: int = 1,
        checkpoint_on_interrupt: bool = False,
        inference_mode: bool = True,
        benchmark: bool | None = None,
        sync_batchnorm: bool = False,
        barebones: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        plugins: Any = None,
        enable_autolog_hparams: bool = True,
        model_registry: str | None = None,
    ) -> None:
        given = locals()
        flags = {name: given[name] for name in FLAG_NAMES}
        self.init_flags = flags  # as given: the tuner builds its trial Trainer from them (trainer/tuner/tuning.py)
        given = apply_barebones({**flags, "logger": logger, "profiler": profiler, "callbacks": callbacks})
        spec = parse_flags(**{name: given[name] for name in FLAG_NAMES})
        self.profiler = build_profiler(profiler)  # trainer/profilers: a pass-through one when None
        self.strategy = spec.strategy
        self.state = TrainerState()
        self.loggers = build_loggers(given["logger"], spec)
        self.callbacks = build_callbacks(callbacks, spec)
        self.datamodule: Any = None
        self._loaded_ckpt_path: str | Path | None = None  # what `ckpt_path` reads after a run
        self._user_ckpt_path: str | Path | None = None  # set through `trainer.ckpt_path = ...` for the next runs
        self._signals = StopSignals()
        progress = Progress()
        metrics = MetricsRouter(spec.log_every_n_steps, progress)
        metrics.loggers = self.loggers
        control = ControlPlane(spec.agree_every_n_steps, spec.terminate_on_nan or spec.detect_anomaly, self._signals)
        train_results = ResultCollection(self.strategy.all_reduce, control.check_sync_keys)
        self.fit_state = FitState(
            trainer=self, spec=spec, strategy=self.strategy, progress=progress, position=LoopPosition(),
            schedule=FitSchedule(spec, progress), control=control, metrics=metrics, hooks=HookDispatcher(self,
            TrainModule), train_results=train_results, results=train_results,
        )
        self.fit_state.loaders.profiler = self.profiler

    # --- entry points -------------------------------------------------------------------------------
    def fit(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: str | Path | None = None, weights_only: bool | None = None) -> None:
        """Train `model`; resume from `ckpt_path` (a path, or "last") when given.

        With several devices or nodes this is where the other ranks start (see docs/distributed.md).
        Data comes from the arguments first, then `datamodule`, then the module's `*_dataloader()` hooks.

        Args:
            model: the TrainModule to train, or `torch.compile(module)`: the module trains with its forward
                compiled, with the same compile arguments (see docs/compile.md).
            train_dataloaders: a DataLoader (or iterable of batches) for training; a DataModule is accepted too.
            val_dataloaders: a DataLoader, or a list of them, for validation.
            datamodule: a DataModule providing the loaders.
            ckpt_path: a checkpoint file (or sharded folder) to resume from; `"last"` takes the newest checkpoint
                of the ModelCheckpoint callbacks and starts from scratch when there is none.
            weights_only: Lightning 2.6's switch for `torch.load`: None or True (checkpoints always load
                weights-only here); False is refused.

        Raises:
            MisconfigurationError: the module lacks `training_step` or `configure_optimizers`, or returns
                something the Trainer cannot use.
            CheckpointLoadError: `ckpt_path` is damaged, foreign, or does not fit the model.
        """
        if datamodule is None and isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        check_weights_only(weights_only)
        self._launch(TrainerFn.FITTING, model, datamodule,
                     {"train": train_dataloaders, "val": val_dataloaders}, ckpt_path)

    def validate(self, model: Any = None, dataloaders: Any = None, ckpt_path: str | Path | None = None,
                 verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None,
                 ) -> list[dict[str, float]]:
        """Run one validation epoch; returns one dict per dataloader of the epoch values sent to the loggers (as
        Lightning's), and with `verbose` rank 0 prints them as a table. Without a model (the one of the previous fit)
        and without `ckpt_path`, the best checkpoint of that fit is loaded first, as in Lightning. `weights_only`: as
        in `fit`."""
        check_weights_only(weights_only)
        return self._evaluate(TrainerFn.VALIDATING, model, dataloaders, ckpt_path, verbose, datamodule)

    def test(self, model: Any = None, dataloaders: Any = None, ckpt_path: str | Path | None = None,
             verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None,
             ) -> list[dict[str, float]]:
        """Run one test epoch; returns one metrics dict per dataloader (see `validate`)."""
        check_weights_only(weights_only)
        return self._evaluate(TrainerFn.TESTING, model, dataloaders, ckpt_path, verbose, datamodule)

    def _evaluate(self, fn: TrainerFn, model: Any, dataloaders: Any, ckpt_path: str | Path | None, verbose: bool,
                  datamodule: Any) -> list[dict[str, float]]:
        if datamodule is None and isinstance(dataloaders, DataModule):
            datamodule, dataloaders = dataloaders, None
        stage = "val" if fn == TrainerFn.VALIDATING else "test"
        results = self._launch(fn, model, datamodule, {stage: dataloaders}, ckpt_path) or []
        if verbose and self.is_global_zero:
            print_results(results, fn.value)
        return results

    def predict(self, model: Any = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: str | Path | None = None,
                weights_only: bool | None = None) -> list[Any] | None:
        """Run predict_step over the predict loader(s); returns the predictions: a list of batch outputs (one
        list per loader when several). With several ranks every rank returns the predictions of all ranks in
        the data set's order, as one process over the same data would (Lightning returns each rank's shard);
        `return_predictions=False` (None means True) keeps and gathers nothing. `weights_only`: as in `fit`."""
        check_weights_only(weights_only)
        return self._launch(TrainerFn.PREDICTING, model, datamodule,
                            {"predict": dataloaders, "return_predictions": return_predictions}, ckpt_path)

    def init_module(self, empty_init: bool | None = None) -> AbstractContextManager:
        """Context manager for building the model: tensors are created on the strategy's device in the
        precision's dtype; under zero2/zero3 on the meta device, materialised shard by shard when fit() shards
        the model (so no rank holds the whole model). `empty_init=True` leaves the values uninitialised (you
        load a checkpoint next); None lets the strategy decide. See docs/zero.md."""
        return self.strategy.tensor_init_context(empty_init)

    def save_checkpoint(self, filepath: str | Path, weights_only: bool = False, storage_options: Any = None) -> None:
        """Save a checkpoint. Call it on every rank: the strategy decides who writes. `storage_options` (Lightning's
        options for its CheckpointIO) must be None: remote filesystems are configured the fsspec way here."""
        if storage_options is not None:
            raise ConfigError(
                f"save_checkpoint(storage_options={storage_options!r}): this Trainer writes through fsspec, configured "
                "by its environment variables and config files (e.g. AWS_ENDPOINT_URL); drop the argument."
            )
        if self.fit_state.module is None:
            raise MisconfigurationError("save_checkpoint() needs a model: call it during or after fit().")
        with self.fit_state.control.outside_steps():  # rank 0 may write for long while the others wait: no bound
            checkpoint = ckpt.dump_checkpoint(self.fit_state, weights_only)
            self.strategy.save_checkpoint(checkpoint, filepath)

    # --- the run ------------------------------------------------------------------------------------
    def _launch(self, fn: TrainerFn, model: Any, datamodule: Any, loaders: dict[str, Any],
                ckpt_path: str | Path | None) -> Any:
        """Run on every rank through the strategy's launcher; adopt rank 0's outcome if it ran elsewhere."""
        if model is not None:  # torch.compile(module): train `module`, its forward compiled by the strategy with
            # the user's arguments (strategies/model/compiled.py)
            model, self.fit_state.compiler = unwrap_compiled(model)
        out = self.strategy.launch(self._run_rank, fn, model, datamodule, loaders, ckpt_path)
        return out.adopt_into(self.fit_state, model) if out is not None else None

    def _run_rank(self, *args: Any) -> Any:
        return pack_if_child(self.fit_state, self._run(*args))

    def _run(self, fn: TrainerFn, model: Any, datamodule: Any, loaders: dict[str, Any],
             ckpt_path: str | Path | None) -> Any:
        model_given, model = model is not None, self._attach(fn, model, datamodule)
        run_start.before_environment(self, model)  # configure_callbacks, then the uncalled-hook check
        self.state.fn, self.state.status = fn, TrainerStatus.RUNNING
        stage, loop = fn.value, self.fit_state
        announce_start(loop.spec.barebones)
        try:
            self.strategy.setup_environment()
            loop.control.start(self.strategy)
            loop.train_results.defer_sync = self.world_size > 1
            agree_logger_versions(self.strategy, self.loggers)
            if self.profiler.enabled:
                self.profiler.setup(stage, self.local_rank if self.world_size > 1 else None, self._profile_dir())
            enable_determinism(loop.spec.deterministic)
            apply_cudnn_benchmark(loop.spec.benchmark, loop.spec.deterministic)
            run_start.prepare_data(self, model)
            if self.datamodule is not None:
                profiled_method(self.profiler, self.datamodule, "setup", DATAMODULE)(stage=fn)
            call_hook(loop, "setup", stage=fn)  # Lightning passes the TrainerFn ("fit", ...) by keyword
            run_start.configure_model(self.strategy, model, self.profiler)
            loop.loaders.bind(loop.spec, self.strategy, model, self.datamodule, fn, loaders)  # requested by the loops
            run_start.read_signatures(loop, model, fn)
            run_start.sync_batchnorm(self, model)
            self.strategy.setup_module(model)
            if loop.compiler is not None:
                self.strategy.compile_module(loop.compiler)
            if ckpt_path is None and self._user_ckpt_path is not None:  # `trainer.ckpt_path = ...`, as Lightning
                ckpt_path = self._user_ckpt_path
            path = resolve_ckpt_path(self, default_ckpt_path(self, fn, ckpt_path, model_given))
            self._loaded_ckpt_path = str(path) if path else None
            checkpoint = ckpt.restore_module_from(self.strategy, model, path) if path else None
            if fn == TrainerFn.FITTING:
                return self._fit(model, checkpoint, path)
            model.zero_grad()  # as Lightning, before every stage
            return self._evaluate_or_predict(fn, loaders)
        except BaseException as exc:
            self.state.status = TrainerStatus.INTERRUPTED
            clearer = self._report_failure(exc)
            call_hook(loop, "on_exception", exc)
            if self.datamodule is not None:
                self.datamodule.on_exception(exc)
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C: teardown runs, and code after fit() does not
                raise SystemExit(failure.INTERRUPTED_EXIT_CODE) from None
            if clearer is not None:
                raise clearer from exc
            raise
        finally:
            self._teardown(fn)

    def _report_failure(self, exc: BaseException) -> BaseException | None:
        """Print the root cause rank-prefixed, first; name a lost or hung peer; say why a rank leaves early."""
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            failure.report_early_exit(exc, self)
            return None
        if self.world_size == 1:
            return None
        kind = failure.classify(exc)
        explained = self.fit_state.control.explain_lost_peer(self.fit_state) if kind else None
        finding = self.strategy.diagnose_peer_failure(kind == "timeout") if kind and explained is None else None
        clearer = explained or failure.peer_failure(exc, self.global_rank, finding, self.strategy.describe_timeout())
        failure.report(clearer if clearer is not None else exc, self.global_rank)
        if kind:
            self.strategy.end_hung_peers()
        return clearer

    def _attach(self, fn: TrainerFn, model: Any, datamodule: Any) -> Any:
        loop = self.fit_state
        if model is None:
            model = loop.module
        run_start.check_model(fn, model, loop.compiler is not None)
        loop.module, model.trainer = model, self
        if datamodule is not None:
            self.datamodule, datamodule.trainer = datamodule, self
        loop.automatic = bool(getattr(model, "automatic_optimization", True))
        loop.hooks.reset()
        loop.metrics.reset()
        loop.train_results.reset()
        loop.results = loop.train_results
        return model

    def _fit(self, model: Any, checkpoint: dict[str, Any] | None, path: Any) -> None:
        loop = self.fit_state
        setup_optimization(self, model)
        loop.progress.settle()  # a second fit() keeps the counters, as in Lightning
        loop.position.phase = Phase.BETWEEN_BATCHES
        loop.resume_point = None
        if checkpoint is not None:
            ckpt.restore_training_state(loop, checkpoint, path)
        for cb in self.checkpoint_callbacks:
            if cb.dirpath is not None:
                remove_stale_temp_files(cb.dirpath)
        if loop.spec.enable_autolog_hparams:
            loop.metrics.log_hyperparams(model, self.datamodule)
        loop.schedule.start(0, False, self.world_size)  # the batch counts once the loaders are requested
        loop.metrics.watch(loop.train_results)
        call_hook(loop, "on_fit_start")
        model.zero_grad()  # as Lightning, before every stage
        self._signals.install()  # restored in _teardown
        with torch.autograd.set_detect_anomaly(loop.spec.detect_anomaly):
            loops.run_fit(loop)
        self.state.status = TrainerStatus.FINISHED
        call_hook(loop, "on_fit_end")

    def _evaluate_or_predict(self, fn: TrainerFn, loaders: dict[str, Any]) -> Any:
        if fn == TrainerFn.PREDICTING:
            returned = loaders.get("return_predictions")
            out = evaluation_loop.run_predict(self.fit_state, True if returned is None else bool(returned))
        else:
            stage = RunningStage.VALIDATING if fn == TrainerFn.VALIDATING else RunningStage.TESTING
            out = evaluation_loop.run_evaluation(self.fit_state, stage)
        self.state.status = TrainerStatus.FINISHED
        return out

    def _profile_dir(self) -> str | None:
        folder = self.log_dir
        return None if "://" in folder else folder  # reports are local files; name a dirpath for a remote run

    def _teardown(self, fn: TrainerFn) -> None:
        try:
            try:
                if self.datamodule is not None:  # the datamodule's first, as in Lightning
                    profiled_method(self.profiler, self.datamodule, "teardown", DATAMODULE)(stage=fn)
                call_hook(self.fit_state, "teardown", stage=fn)
            finally:
                self.profiler.describe()  # after the teardown hooks, which it times too (a profiler ends with it)
            for logger in self.loggers:
                logger.finalize("success" if self.state.status == TrainerStatus.FINISHED else "failed")
            if self.state.status == TrainerStatus.FINISHED:
                self.strategy.wait_for_saves()  # a background save's error is this run's error
                self.strategy.barrier("end of run")  # no rank moves on (or exits) while a peer is still in this run
        finally:
            self._signals.restore()
            self.strategy.teardown()
            self.fit_state.metrics.to_cpu()
            self.state.stage = None

