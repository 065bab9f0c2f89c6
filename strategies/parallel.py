"""What every multi-process strategy shares, whatever it wraps the model in: the ranks (launched or joined), the
process group, the control group, the hang bound, the peers' identities, and the sampler arguments.

DDP (strategies/ddp.py) and FSDP2 (strategies/fsdp.py) derive from `ParallelStrategy` and add only their wrapper,
gradient-sync switch and state-dict layout; a further mechanism (tensor parallel) is one more subclass.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.base import Strategy
from strategies.comm import distributed
from strategies.comm.agreement_board import AgreementBoard
from strategies.comm.collective_timeout import CollectiveTimeout, torch_default_timeout
from strategies.comm.peer_failure import PeerFailures
from strategies.exceptions import ConfigError
from strategies.launch.environment import ClusterEnvironment, detect_environment
from strategies.launch.parent_death import die_with_launcher_from_env
from strategies.launch.script_launcher import SubprocessLauncher
from strategies.launch.shutdown import shutdown_at_exit
from strategies.launch.spawn_launcher import SpawnLauncher
from strategies.precision import Precision

_BACKENDS = ("nccl", "gloo", "mpi")
_BOARD_WIDTH = 16  # the most flags a round of the step agreement carries (trainer/ranks/agreement.py posts 10)
_START_METHODS = ("subprocess", "spawn", "fork")


def _elastic_attempt_store(addr: str, port: int, world_size: int, timeout: timedelta | None) -> Any:
    """Under torchrun, the agent hosts the store; key it by restart attempt, or the workers of a restart
    (--max-restarts) can read the failed attempt's gloo addresses and dial dead ranks (seen on torch 2.14.1)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt == "0":
        return None  # a first attempt joins as before (tcp://); only restarts need the attempt prefix
    store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout or timedelta(minutes=30))
    return dist.PrefixStore(f"trainer/attempt_{attempt}", store)


def default_backend(device_type: str) -> str:
    """nccl for CUDA, gloo for everything else."""
    return "nccl" if device_type == "cuda" else "gloo"


class ParallelStrategy(Strategy):
    """One process per device over `len(devices) x num_nodes` ranks; subclasses choose how the model is wrapped.

    Args:
        devices: this machine's devices, one process each; None takes the Trainer's `devices`.
        num_nodes: the number of machines.
        precision: the Precision object; full fp32 when None.
        process_group_backend: `"nccl"` (default for CUDA), `"gloo"` (default for CPU) or `"mpi"`.
        timeout: how long every collective waits for a missing rank (a `timedelta` or seconds); None: the hang
            bound follows the run (`min_timeout`, `timeout_steps`, docs/reliability.md).
        start_method: `"subprocess"` re-runs the script per extra rank; `"spawn"` / `"fork"` use
            torch.multiprocessing.
        min_timeout: with `timeout=None`, the least a collective in a training batch may wait. Default 120 s.
        timeout_steps: with `timeout=None`, how many measured batch times a collective may wait. Default 20.
        activation_checkpointing: module classes whose forward is recomputed in backward (see Strategy).

    Raises:
        ConfigError: an unknown backend or start method, `"nccl"` without CUDA, or `"mpi"` without MPI.
    """

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        num_nodes: int = 1,
        precision: Precision | None = None,
        *,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = None,
        start_method: str = "subprocess",
        min_timeout: timedelta | float | None = None,
        timeout_steps: int | None = None,
        activation_checkpointing: Sequence[type[nn.Module]] | None = None,
    ) -> None:
        super().__init__(precision, activation_checkpointing)
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
        if start_method not in _START_METHODS:
            raise ConfigError(f"start_method={start_method!r} is not valid: use 'subprocess', 'spawn' or 'fork'.")
        self.process_group_backend = backend
        self.collective_timeout = CollectiveTimeout(timeout, min_timeout, timeout_steps)
        self.timeout = self.collective_timeout.fixed
        self.start_method = start_method
        self._launcher: SubprocessLauncher | SpawnLauncher | None = None
        self._script_launcher: SubprocessLauncher | None = None  # set when this process re-ran the script
        self._peers = PeerFailures()
        self._control_group: Any = None  # None: the default group (already on CPU with gloo)
        self._board: AgreementBoard | None = None  # the per-step agreement in shared memory (one machine, gloo)
        self.world_size = len(self.parallel_devices) * num_nodes

    @classmethod
    def from_flags(cls, devices: list[torch.device], num_nodes: int, precision: Precision,
                   **kwargs: Any) -> ParallelStrategy:
        return cls(devices=devices, num_nodes=num_nodes, precision=precision, **kwargs)

    def adopt_flags(self, devices: list[torch.device], num_nodes: int) -> None:
        """An instance passed to the Trainer without `devices` runs on the Trainer's devices and nodes."""
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
            self._launcher = self._script_launcher = SubprocessLauncher(per_node)
        else:
            self._launcher = SpawnLauncher(per_node, self.start_method)
        return self._launcher.launch(fn, *args, env=env)

    def setup_environment(self) -> None:
        env = self._environment()
        if not env.external:
            raise RuntimeError(f"{type(self).__name__}.setup_environment() runs inside launched ranks; call fit().")
        self.global_rank, self.local_rank, self.node_rank = env.global_rank, env.local_rank, env.node_rank
        self.world_size = env.world_size
        super().setup_environment()
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        self._join_process_group(env)
        if self.process_group_backend != "gloo" and self._control_group is None:
            # The control plane (trainer/ranks/agreement.py) reduces a few ints every step: on CPU through gloo,
            # so it never waits for the GPU stream as an NCCL collective on a CUDA tensor would.
            timeout_kw: dict[str, Any] = {"timeout": self.timeout} if self.timeout is not None else {}
            self._control_group = dist.new_group(backend="gloo", **timeout_kw)
        if not self._peers.ready and self.world_size > 1:
            self._peers.gather(self.global_rank, self._script_launcher)
            groups = [(dist.group.WORLD, self.timeout or torch_default_timeout(self.process_group_backend))]
            if self._control_group is not None:
                groups.append((self._control_group, self.timeout or torch_default_timeout("gloo")))
            self.collective_timeout.attach(groups)
        self._open_board()

    def _open_board(self) -> None:
        """A fresh agreement board for this run when every rank is on this machine and gloo carries the gradients
        (strategies/comm/agreement_board.py); otherwise the overlapped agreement stays a round on the control group.
        Collective: every rank decides alike (same backend, same peer table)."""
        if self._board is not None:
            self._board.close()
            self._board = None
        if self.world_size > 1 and self.process_group_backend == "gloo" and self._peers.all_on_this_machine():
            self._board = AgreementBoard.open(self.global_rank, self.world_size, _BOARD_WIDTH,
                                              self._board_timeout_s, self._peers.ended)

    def _board_timeout_s(self) -> float:
        now = self.collective_timeout.current_seconds()
        return now if now is not None else torch_default_timeout("gloo").total_seconds()

    def _join_process_group(self, env: ClusterEnvironment) -> None:
        if dist.is_initialized():
            if dist.get_world_size() != env.world_size:
                raise ConfigError(
                    f"a process group of {dist.get_world_size()} ranks is already running, but this run needs "
                    f"{env.world_size}; destroy it first (torch.distributed.destroy_process_group())."
                )
            return
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

    # --- control plane and failures -------------------------------------------------------------------
    def agree(self, values: list[int]) -> list[int]:
        return distributed.all_reduce_max_ints(values, self._control_group)

    def start_agree(self, values: list[int]) -> distributed.Pending:
        board = self._board
        if board is not None:
            return board.post(values)
        return distributed.start_all_reduce_max_ints(values, self._control_group)

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

    def evaluation_context(self, inference_mode: bool) -> AbstractContextManager:
        # Lightning's rule: gloo collectives on inference tensors fail, so under gloo evaluation runs in no_grad
        return super().evaluation_context(inference_mode and self.process_group_backend != "gloo")

    # --- data ---------------------------------------------------------------------------------
    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}
