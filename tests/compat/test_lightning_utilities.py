"""The small pieces of behaviour that Lightning's import table needed (docs/from-lightning.md, "Every Lightning
import"): each does what Lightning's function or class of that name does, checked on its own and, where Lightning is
installed, against Lightning's on the same input."""

from __future__ import annotations

import os
import pickle
import random
import signal
import threading
import warnings
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from callbacks import Callback, Timer
from callbacks.timer import Interval
from strategies.exceptions import ConfigError, MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel
from trainer import (
    AttributeDict,
    DataModule,
    GradClipAlgorithmType,
    LightningEnum,
    LightningOptimizer,
    MisconfigurationException,
    PossibleUserWarning,
    RunningStage,
    SIGTERMException,
    Trainer,
    TrainerFn,
    TrainerState,
    TrainerStatus,
    TrainModule,
    WarningCache,
    disable_possible_user_warnings,
    find_shared_parameters,
    grad_norm,
    is_oom_error,
    is_overridden,
    is_picklable,
    isolate_rng,
    load_hparams_from_yaml,
    measure_flops,
    move_data_to_device,
    rank_prefixed_message,
    rank_zero_deprecation,
    recursive_detach,
    save_hparams_to_yaml,
    set_shared_parameters,
    suggested_max_num_workers,
)
from trainer.cli import instantiate_class
from trainer.exceptions import MisconfigurationException as ExportedException
from trainer.tuner.batch_size_scaling import is_cuda_out_of_memory, is_cudnn_snafu, is_out_of_cpu_memory


def _net_with_gradients() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    net(torch.randn(5, 4)).pow(2).sum().backward()
    net[2].bias.grad = None  # a parameter without a gradient has no key
    return net


@pytest.mark.parametrize("norm_type", [1, 2, 2.5, "inf"])
def test_grad_norm_gives_each_gradients_norm_and_the_norm_of_all_of_them(norm_type: Any):
    net = _net_with_gradients()
    norms = grad_norm(net, norm_type)
    p = float(norm_type)
    grads = {name: param.grad for name, param in net.named_parameters() if param.grad is not None}
    assert set(norms) == {f"grad_{p}_norm/{name}" for name in grads} | {f"grad_{p}_norm_total"}
    for name, grad in grads.items():
        assert torch.allclose(norms[f"grad_{p}_norm/{name}"], grad.norm(p))
    everything = torch.cat([g.flatten() for g in grads.values()])
    assert torch.allclose(norms[f"grad_{p}_norm_total"], everything.norm(p))


def test_grad_norm_keys_follow_the_separator_and_refuse_a_bad_norm():
    net = _net_with_gradients()
    assert "grad_2.0_norm.0.weight" in grad_norm(net, 2, group_separator=".")
    assert grad_norm(nn.Linear(2, 2), 2) == {}  # no gradients yet
    with pytest.raises(ValueError, match="positive number or 'inf'"):
        grad_norm(net, 0)


def test_grad_norm_matches_lightnings():
    lightning_grad_norm = pytest.importorskip("lightning.pytorch.utilities").grad_norm
    net = _net_with_gradients()
    ours, theirs = grad_norm(net, 2), lightning_grad_norm(net, 2)
    assert ours.keys() == theirs.keys()
    assert all(torch.allclose(ours[k], torch.as_tensor(theirs[k])) for k in ours)


def test_attribute_dict_reads_writes_and_deletes_keys_as_attributes():
    hparams = AttributeDict(lr=0.1)
    hparams.batch_size = 32
    assert (hparams.lr, hparams["batch_size"]) == (0.1, 32)
    del hparams.lr
    assert hparams == {"batch_size": 32}
    with pytest.raises(AttributeError):
        _ = hparams.lr
    with pytest.raises(AttributeError):
        del hparams.lr
    assert not hasattr(hparams, "missing") and pickle.loads(pickle.dumps(hparams)) == hparams


class _Hooked(TrainModule):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return None


def test_is_overridden_takes_lightnings_arguments_and_default_parent():
    class Data(DataModule):
        def train_dataloader(self) -> Any:
            return []

    class Seen(Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            pass

    assert is_overridden("training_step", _Hooked()) and not is_overridden("validation_step", _Hooked())
    assert is_overridden("train_dataloader", Data()) and not is_overridden("val_dataloader", Data())
    assert is_overridden("on_fit_start", Seen()) and not is_overridden("on_fit_end", Seen())
    assert is_overridden("training_step", None) is False
    assert is_overridden("forward", nn.Linear(1, 1), parent=nn.Module)
    with pytest.raises(ValueError, match="pass `parent=`"):
        is_overridden("forward", nn.Linear(1, 1))
    with pytest.raises(ValueError, match="no method 'trainig_step'"):
        is_overridden("trainig_step", _Hooked())


def test_lightning_enums_compare_with_strings_in_any_case_and_parse_names_and_values():
    assert TrainerFn.FITTING == "fit" and TrainerFn.FITTING == "FIT" and RunningStage.TRAINING != "fit"
    assert {TrainerFn.FITTING: 1}["fit"] == 1  # equal members and strings hash alike
    assert TrainerFn.from_str("fitting") is TrainerFn.FITTING
    assert TrainerFn.from_str("Validate", source="value") is TrainerFn.VALIDATING
    assert RunningStage.from_str("sanity_check", source="any") is RunningStage.SANITY_CHECKING
    with pytest.raises(ValueError, match="expected one of"):
        TrainerFn.from_str("fit")  # a value, not a name
    assert issubclass(GradClipAlgorithmType, LightningEnum) and GradClipAlgorithmType("norm") == "NORM"
    assert GradClipAlgorithmType.supported_type("value") and not GradClipAlgorithmType.supported_type("l2")
    assert sorted(GradClipAlgorithmType.supported_types()) == ["norm", "value"]


def test_the_state_says_whether_a_run_stopped_and_which_loader_a_stage_reads():
    assert TrainerStatus.INTERRUPTED.stopped and not TrainerStatus.RUNNING.stopped
    assert TrainerState(status=TrainerStatus.FINISHED).stopped and not TrainerState().stopped
    assert [s.dataloader_prefix for s in RunningStage] == ["train", "val", "val", "test", "predict"]
    assert [s.evaluating for s in RunningStage] == [False, True, True, True, False]


def test_a_trainer_run_still_reports_its_state_with_lightning_enums(tmp_path: Path):
    trainer = Trainer(default_root_dir=tmp_path, max_steps=1, limit_val_batches=0, **QUIET)
    trainer.fit(BoringModel())
    assert trainer.state.fn == "fit" and trainer.state.status == TrainerStatus.FINISHED and trainer.state.stopped


def test_clip_gradients_takes_the_algorithm_enum(tmp_path: Path):
    class Clipping(BoringModel):
        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            self.clip_gradients(optimizer, gradient_clip_val=0.25, gradient_clip_algorithm=GradClipAlgorithmType.VALUE)
            self.largest = max(p.grad.abs().max().item() for p in self.parameters())

    model = Clipping()
    Trainer(default_root_dir=tmp_path, max_steps=1, limit_val_batches=0, **QUIET).fit(model)
    assert model.largest == 0.25  # the bias gradients (8, a batch of 8 summed) were clipped to the value


def test_misconfiguration_exception_catches_what_we_raise_for_a_refused_setting(tmp_path: Path):
    assert issubclass(ConfigError, MisconfigurationException) and issubclass(MisconfigurationError,
                                                                             MisconfigurationException)
    assert ExportedException is MisconfigurationException
    with pytest.raises(MisconfigurationException, match="max_epochs"):
        Trainer(max_epochs=-5)
    with pytest.raises(MisconfigurationException, match="training_step"):
        Trainer(default_root_dir=tmp_path, max_steps=1, **QUIET).fit(TrainModule())


def test_measure_flops_counts_a_linear_layers_forward_and_backward():
    with torch.device("meta"):
        model, x = nn.Linear(16, 8, bias=False), torch.randn(4, 16)
    forward = measure_flops(model, lambda: model(x))
    assert forward == 2 * 4 * 16 * 8
    assert measure_flops(model, lambda: model(x), lambda y: y.sum()) == 2 * forward  # the weight's gradient
    x.requires_grad_()
    assert measure_flops(model, lambda: model(x), lambda y: y.sum()) == 3 * forward  # and the input's


def test_isolate_rng_puts_every_generator_back():
    torch.manual_seed(1)
    random.seed(1)
    expected = (torch.rand(1), random.random())
    torch.manual_seed(1)
    random.seed(1)
    with isolate_rng():
        torch.rand(3), random.random()
    assert (torch.rand(1), random.random()) == expected
    with pytest.raises(RuntimeError), isolate_rng():
        torch.rand(3)
        raise RuntimeError("the states come back on an error too")


def test_shared_parameters_are_found_and_tied_again():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    shared = find_shared_parameters(model)
    assert shared == [["embed.weight", "head.weight"]]
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())  # e.g. after a copy
    assert find_shared_parameters(model) == []
    assert set_shared_parameters(model, shared).head.weight is model.embed.weight


def test_shared_parameters_match_lightnings():
    lightning_find = pytest.importorskip("lightning.pytorch.utilities").find_shared_parameters
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    model[2].weight = model[0].weight
    assert find_shared_parameters(model) == lightning_find(model)


def test_suggested_max_num_workers_shares_this_process_cpus():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert suggested_max_num_workers(1) == max(1, cpus - 1)
    assert suggested_max_num_workers(10 * cpus) == 1
    with pytest.raises(ValueError, match="local_world_size=0"):
        suggested_max_num_workers(0)


def test_rank_zero_helpers_prefix_deprecate_and_warn_once():
    assert rank_prefixed_message("saved", 3) == "[rank: 3] saved" and rank_prefixed_message("saved", None) == "saved"
    with pytest.warns(DeprecationWarning, match="old"):
        rank_zero_deprecation("old")
    cache = WarningCache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.warn("once")
        cache.warn("once")
        cache.warn("another", category=PossibleUserWarning)
    assert [(str(w.message), w.category) for w in caught] == [("once", UserWarning),
                                                              ("another", PossibleUserWarning)]


def test_disable_possible_user_warnings_silences_that_category_only():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        disable_possible_user_warnings()
        warnings.warn("maybe a mistake", PossibleUserWarning, stacklevel=1)
        warnings.warn("a plain one", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a plain one"]


def test_out_of_memory_errors_are_told_apart_and_recognised():
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    cudnn = RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ...")
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:83] DefaultCPUAllocator: can't allocate memory: 9 bytes")
    assert [is_cuda_out_of_memory(cuda), is_cudnn_snafu(cudnn), is_out_of_cpu_memory(cpu)] == [True] * 3
    assert not any(f(e) for f, e in [(is_cuda_out_of_memory, cpu), (is_cudnn_snafu, cuda), (is_out_of_cpu_memory,
                                                                                              cudnn)])
    assert all(map(is_oom_error, (cuda, cudnn, cpu, torch.OutOfMemoryError("MPS backend out of memory"))))
    assert not is_oom_error(RuntimeError("CUDA out of memory", "two arguments")) and not is_oom_error(ValueError("x"))


def test_recursive_detach_keeps_the_containers_and_drops_the_graphs():
    w = torch.ones(2, requires_grad=True)
    data = {"loss": w.sum(), "parts": [w * 2, (w * 3, "label")], "plain": 1}
    ordered = OrderedDict(a=w * 1)
    counts: defaultdict[str, Any] = defaultdict(list, a=w * 1)
    out = recursive_detach(data, to_cpu=True)
    assert not out["loss"].requires_grad and not out["parts"][0].requires_grad
    assert isinstance(out["parts"][1], tuple) and out["parts"][1][1] == "label" and out["plain"] == 1
    assert type(recursive_detach(ordered)) is OrderedDict and recursive_detach(counts).default_factory is list


def test_move_data_to_device_takes_a_string_device():
    moved = move_data_to_device({"x": torch.ones(1, dtype=torch.float64)}, "cpu")
    assert moved["x"].device == torch.device("cpu")


def test_is_picklable():
    assert is_picklable({"lr": 0.1}) and not is_picklable(lambda: 0) and not is_picklable(threading.Lock())


def test_hparams_yaml_round_trip_and_values_yaml_cannot_hold(tmp_path: Path):
    path = tmp_path / "hparams.yaml"
    with pytest.warns(UserWarning, match="'lock' is left out"):
        save_hparams_to_yaml(path, AttributeDict(lr=0.1, layers=(2, 3), nested=AttributeDict(a=1),
                                                 lock=threading.Lock()))
    assert load_hparams_from_yaml(path) == {"lr": 0.1, "layers": [2, 3], "nested": {"a": 1}}


def test_hparams_yaml_is_read_by_lightning_alike(tmp_path: Path):
    saving = pytest.importorskip("lightning.pytorch.core.saving")
    path = tmp_path / "hparams.yaml"
    save_hparams_to_yaml(path, {"lr": 0.1, "name": "net", "sizes": [1, 2]})
    assert saving.load_hparams_from_yaml(str(path), use_omegaconf=False) == load_hparams_from_yaml(path)


def test_instantiate_class_builds_the_configured_class():
    params = [nn.Parameter(torch.zeros(1))]
    optimizer = instantiate_class(params, {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.5}})
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.5
    assert instantiate_class((4, 2), {"class_path": "torch.nn.Linear"}).out_features == 2
    with pytest.raises(ValueError, match="class_path"):
        instantiate_class((), {"init_args": {}})


def test_the_timer_takes_lightnings_interval_enum():
    assert Interval.step == "step" and Timer(duration="00:00:00:01", interval=Interval.epoch)


class _Term(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


def test_sigterm_stops_the_run_with_a_sigterm_exception(tmp_path: Path):
    seen: list[type] = []

    class OnException(Callback):
        def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
            seen.append(type(exception))

    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_val_batches=0, callbacks=[OnException()],
                      **QUIET)
    with pytest.raises(SIGTERMException) as stopped:
        trainer.fit(_Term())
    assert isinstance(stopped.value, SystemExit) and stopped.value.code == 128 + signal.SIGTERM
    assert seen == [SIGTERMException] and list(tmp_path.rglob("last.ckpt"))


def test_an_optimizer_wrapped_by_hand_mirrors_and_steps_the_optimizer():
    model = nn.Linear(3, 1)
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    wrapped = LightningOptimizer(adam)
    assert isinstance(wrapped, LightningOptimizer) and isinstance(wrapped, torch.optim.Adam)
    assert wrapped.optimizer is adam and wrapped.param_groups is adam.param_groups
    wrapped.param_groups[0]["lr"] = 0.5
    assert adam.param_groups[0]["lr"] == 0.5
    model(torch.ones(1, 3)).sum().backward()
    before = model.weight.detach().clone()
    assert wrapped.step(lambda: 7) == 7  # the optimizer's own step: it returns what the closure returned
    assert not torch.equal(model.weight, before) and wrapped.state_dict() == adam.state_dict()
