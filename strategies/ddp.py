"""DDP: one process per device, `torch.nn.parallel.DistributedDataParallel` around the step router.

Processes come from torchrun or SLURM (the Trainer joins that world), or from our own launchers:
re-running the script ("ddp") or torch.multiprocessing spawn ("ddp_spawn").
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from strategies.base import NULL_CONTEXT, Strategy, _StepRouter
from strategies.collective_timeout import CollectiveTimeout, torch_default_timeout
from strategies.environment import ClusterEnvironment, detect_environment
from strategies.exceptions import ConfigError
from strategies.launchers import SubprocessLauncher
from strategies.parent_death import die_with_launcher_from_env
from strategies.peer_failure import PeerFailures
from strategies.precision import Precision
from strategies.shutdown import shutdown_at_exit
from strategies.spawn_launcher import SpawnLauncher

T = TypeVar("T")
_BACKENDS = ("nccl", "gloo", "mpi")


def _elastic_attempt_store(addr: str, port: int, world_size: int, timeout: timedelta | None) -> Any:
    """Under torchrun, the agent hosts the store; key it by restart attempt, or the workers of a restart
    (--max-restarts) can read the failed attempt's gloo addresses and dial dead ranks (seen on torch 2.14.1)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt == "0":
        return None  # a first attempt joins as before (tcp://); only restarts need the attempt prefix
    store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout or timedelta(minutes=30))
    return dist.PrefixStore(f"trainer/attempt_{attempt}", store)


def default_backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


class DDPStrategy(Strategy):
    """Data-parallel training over `len(devices) x num_nodes` processes with torch's DDP.

    `strategy="ddp"` and `"ddp_spawn"` build this class; pass an instance for its options. Under torchrun or
    SLURM the ranks join the launcher's world; otherwise rank 0 starts the other local ranks (see
    docs/distributed.md). A DistributedSampler is injected into plain DataLoaders.

    Args:
        devices: this machine's devices, one process each; None takes the Trainer's `devices`.
        num_nodes: the number of machines (an instance built without `devices` takes the Trainer's devices
            and num_nodes).
        precision: the Precision object; full fp32 when None.
        process_group_backend: `"nccl"` (default for CUDA), `"gloo"` (default for CPU) or `"mpi"`.
        timeout: how long every collective waits for a missing rank (a `timedelta` or seconds). None (the default):
            the hang bound follows the run, see `min_timeout` and docs/reliability.md.
        min_timeout: with `timeout=None`, collectives in training batches wait at most
            max(min_timeout, timeout_steps x the measured batch time); torch's default elsewhere. Default 120 s.
        timeout_steps: see `min_timeout`; default 20.
        start_method: `"subprocess"` re-runs the script per extra rank (`"ddp"`); `"spawn"` uses
            torch.multiprocessing (`"ddp_spawn"`); `"fork"` forks.
        find_unused_parameters: passed to DistributedDataParallel.
        static_graph: passed to DistributedDataParallel.
        **ddp_kwargs: further DistributedDataParallel options (e.g. `gradient_as_bucket_view=True`).

    Raises:
        ConfigError: an unknown backend or start method, `"nccl"` without CUDA, or `"mpi"` without MPI.

    Example:
        ```python
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(minutes=30))
        trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy)
        ```
    """

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        num_nodes: int = 1,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = None,
        start_method: str = "subprocess",
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        min_timeout: timedelta | float | None = None,
        timeout_steps: int | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(precision)
        self._devices_given, self._backend_given = devices is not None, process_group_backend is not None
        self.parallel_devices = list(devices) if devices else [torch.device("cpu")]
        self.num_nodes = num_nodes
        device_type = self.parallel_devices[0].type
        backend = process_group_backend or default_backend(device_type)
        if backend not in _BACKENDS:
            raise ConfigError(f"process_group_backend={backend!r} is not valid: use one of {_BACKENDS}.")
        if backend == "nccl" and device_type != "cuda":
            raise ConfigError("process_group_backend='nccl' needs CUDA devices; use 'gloo' on CPU.")
        if backend == "mpi" and not dist.is_mpi_available():
            raise ConfigError("process_group_backend='mpi' needs a torch built with MPI; this one is not. Use 'gloo'.")
        if start_method not in ("subprocess", "spawn", "fork"):
            raise ConfigError(f"start_method={start_method!r} is not valid: use 'subprocess', 'spawn' or 'fork'.")
        self.process_group_backend = backend
        self.collective_timeout = CollectiveTimeout(timeout, min_timeout, timeout_steps)
        self.timeout = self.collective_timeout.fixed
        self.start_method = start_method
        self._launcher: SubprocessLauncher | SpawnLauncher | None = None
        self._peers = PeerFailures()
        self._ddp_kwargs = {"find_unused_parameters": find_unused_parameters, "static_graph": static_graph,
                            **ddp_kwargs}
        self.world_size = len(self.parallel_devices) * num_nodes

    @classmethod
    def register(cls, registry: Any) -> None:
        registry.register("ddp", cls, description="DDP, ranks started by re-running the script")
        registry.register("ddp_spawn", cls, description="DDP, ranks started by torch.multiprocessing",
                          start_method="spawn")

    @classmethod
    def from_flags(cls, devices: list[torch.device], num_nodes: int, precision: Precision,
                   **kwargs: Any) -> DDPStrategy:
        return cls(devices=devices, num_nodes=num_nodes, precision=precision, **kwargs)

    def adopt_flags(self, devices: list[torch.device], num_nodes: int) -> None:
        """`Trainer(strategy=DDPStrategy(timeout=...), devices=2)`: the instance runs on the Trainer's devices."""
        if self._devices_given:
            return
        self.parallel_devices, self.num_nodes = list(devices), num_nodes
        self.world_size = len(devices) * num_nodes
        if not self._backend_given:
            self.process_group_backend = default_backend(devices[0].type)

    # --- topology -----------------------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[self.local_rank]

    def rank_layout(self) -> list[tuple[int, int, int]]:
        """(global rank, node rank, local rank) of every process of the run, without starting any."""
        per_node = len(self.parallel_devices)
        return [(node * per_node + local, node, local) for node in range(self.num_nodes) for local in range(per_node)]

    def _environment(self) -> ClusterEnvironment:
        return detect_environment(len(self.parallel_devices), self.num_nodes)

    # --- lifecycle ----------------------------------------------------------------------------
    def launch(self, fn: Any, *args: Any) -> Any:
        env = self._environment()
        if env.external:
            die_with_launcher_from_env()  # a rank our launcher started ends with it (no-op under torchrun, SLURM)
            return fn(*args)
        per_node = len(self.parallel_devices)
        if self.start_method == "subprocess":
            self._launcher = SubprocessLauncher(per_node)
        else:
            self._launcher = SpawnLauncher(per_node, self.start_method)
        return self._launcher.launch(fn, *args, env=env)

    def setup_environment(self) -> None:
        env = self._environment()
        if not env.external:
            raise RuntimeError("DDPStrategy.setup_environment() runs inside launched ranks; call fit() instead.")
        self.global_rank, self.local_rank, self.node_rank = env.global_rank, env.local_rank, env.node_rank
        self.world_size = env.world_size
        super().setup_environment()
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        if not dist.is_initialized():
            kwargs: dict[str, Any] = {"timeout": self.timeout} if self.timeout is not None else {}
            port = env.master_port
            if port is None:
                raise ConfigError("MASTER_PORT is not set for this rank; set it, or let the Trainer launch the ranks.")
            store = _elastic_attempt_store(env.master_addr, port, env.world_size, self.timeout)
            init = {"store": store} if store is not None else {"init_method": f"tcp://{env.master_addr}:{port}"}
            dist.init_process_group(self.process_group_backend, rank=env.global_rank, world_size=env.world_size,
                                    **init, **kwargs)
            # Kept for later validate()/test() calls in the same script: re-creating it on the same
            # port races with ranks still leaving the old one. Torn down deliberately at exit (shutdown.py).
            shutdown_at_exit()
        elif dist.get_world_size() != env.world_size:
            raise ConfigError(
                f"a process group of {dist.get_world_size()} ranks is already running, but this run needs "
                f"{env.world_size}; destroy it first (torch.distributed.destroy_process_group())."
            )
        if self.process_group_backend != "gloo" and self._control_group is None:
            # The control plane (trainer/control.py) reduces a few ints every step: on CPU through gloo,
            # so it never waits for the GPU stream as an NCCL collective on a CUDA tensor would.
            timeout_kw: dict[str, Any] = {"timeout": self.timeout} if self.timeout is not None else {}
            self._control_group = dist.new_group(backend="gloo", **timeout_kw)
        if not self._peers.ready and self.world_size > 1:
            self._peers.gather(self.global_rank, self._launcher if isinstance(self._launcher, SubprocessLauncher)
                               else None)
            groups = [(dist.group.WORLD, self.timeout or torch_default_timeout(self.process_group_backend))]
            if self._control_group is not None:
                groups.append((self._control_group, self.timeout or torch_default_timeout("gloo")))
            self.collective_timeout.attach(groups)

    # --- failures -----------------------------------------------------------------------------
    def bound_collectives(self, step_seconds: float | None) -> bool:
        """Training batches take `step_seconds` each: collectives may wait per the hang rule (None: outside training,
        torch's default). False, and nothing done, with a fixed `timeout`."""
        return self.collective_timeout.apply(step_seconds)

    def diagnose_peer_failure(self, timed_out: bool) -> str | None:
        return self._peers.diagnose(timed_out)

    def end_hung_peers(self) -> None:
        self._peers.end_hung()

    def describe_timeout(self) -> str:
        return self.collective_timeout.describe()

    def _wrap(self, router: _StepRouter) -> torch.nn.Module:
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        return DistributedDataParallel(router, device_ids=device_ids, **self._ddp_kwargs)


    # --- the step -----------------------------------------------------------------------------
    def manual_step_context(self) -> AbstractContextManager:
        model = self._model
        # DDP would prepare its gradient sync after forward returns, i.e. after the user's manual_backward already
        # ran inside it, leaving the reducer waiting for a backward that never comes. manual_backward prepares it.
        return model.no_sync() if isinstance(model, DistributedDataParallel) else NULL_CONTEXT

    def manual_backward(self, loss: Tensor) -> None:
        model = self._model
        if isinstance(model, DistributedDataParallel) and torch.is_grad_enabled():
            model.require_forward_param_sync = True
            model.reducer.prepare_for_backward(list(_find_tensors(loss)) if model.find_unused_parameters else [])
        self.backward(loss)

    def no_backward_sync(self, enabled: bool) -> AbstractContextManager:
        model = self._model
        if enabled and isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return NULL_CONTEXT

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def __repr__(self) -> str:
        return (f"DDPStrategy(devices={len(self.parallel_devices)}, num_nodes={self.num_nodes}, "
                f"backend={self.process_group_backend!r}, start_method={self.start_method!r})")
