"""Where this process sits in the world: torchrun, SLURM, manual multi-node env vars, or a plain
local run. Pure functions of the environment mapping, so they are testable without any launch."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from strategies.exceptions import ConfigError


@dataclass(frozen=True)
class ClusterEnvironment:
    """The rank layout of this process. `external` means someone else started every rank (torchrun,
    SLURM, or our own launcher's children), so the Trainer must join the world and launch nothing."""

    kind: str  # "torchrun" | "slurm" | "manual" | "local"
    external: bool
    world_size: int
    global_rank: int
    local_rank: int
    node_rank: int
    master_addr: str
    master_port: int | None


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ConfigError(f"environment variable {key}={env[key]!r} is not an integer.") from None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list such as 'gpu[03-05,07],cpu1' → 'gpu03'."""
    match = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return "127.0.0.1"
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _slurm_port(job_id: str) -> int:
    """A port derived from the job id, identical on every task of the job (10000-19999)."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return 10000 + int(digits[-4:])


def detect_environment(
    devices_per_node: int, num_nodes: int, env: Mapping[str, str] | None = None
) -> ClusterEnvironment:
    """Find the rank layout from the environment, and check it against devices x num_nodes."""
    env = os.environ if env is None else env
    expected = devices_per_node * num_nodes
    if all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        found = ClusterEnvironment(
            kind="torchrun", external=True, world_size=_int(env, "WORLD_SIZE"), global_rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK"), node_rank=_int(env, "GROUP_RANK") if "GROUP_RANK" in env else (
                _int(env, "NODE_RANK") if "NODE_RANK" in env else _int(env, "RANK") // max(devices_per_node, 1)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else None,
        )
        source = "WORLD_SIZE"
    elif "SLURM_NTASKS" in env and "SLURM_PROCID" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        found = ClusterEnvironment(
            kind="slurm", external=True, world_size=_int(env, "SLURM_NTASKS"), global_rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            node_rank=_int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0,
            master_addr=env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_JOB_NODELIST",
                                                                           env.get("SLURM_NODELIST", "127.0.0.1"))),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else _slurm_port(env.get("SLURM_JOB_ID", "0")),
        )
        source = "SLURM_NTASKS"
    elif num_nodes > 1 or "NODE_RANK" in env:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK") if k not in env]
        if num_nodes > 1 and missing:
            raise ConfigError(
                f"num_nodes={num_nodes} without a launcher needs the environment variables {missing} on every node "
                "(or start the script with torchrun or srun)."
            )
        node_rank = _int(env, "NODE_RANK") if "NODE_RANK" in env else 0
        if not 0 <= node_rank < num_nodes:
            raise ConfigError(f"NODE_RANK={node_rank} is outside [0, {num_nodes - 1}] for num_nodes={num_nodes}.")
        return ClusterEnvironment(
            kind="manual", external=False, world_size=expected, global_rank=node_rank * devices_per_node,
            local_rank=0, node_rank=node_rank, master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else None,
        )
    else:
        return ClusterEnvironment(kind="local", external=False, world_size=expected, global_rank=0, local_rank=0,
                                  node_rank=0, master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                                  master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else None)
    if found.world_size != expected:
        raise ConfigError(
            f"the {found.kind} environment has {source}={found.world_size}, but the Trainer was configured for "
            f"devices={devices_per_node} x num_nodes={num_nodes} = {expected} processes. Make them agree."
        )
    if not 0 <= found.local_rank < devices_per_node:
        raise ConfigError(
            f"LOCAL_RANK={found.local_rank} in the {found.kind} environment, but devices={devices_per_node}: start "
            f"as many processes per node as devices (e.g. torchrun --nproc_per_node {devices_per_node})."
        )
    if not 0 <= found.global_rank < found.world_size:
        raise ConfigError(f"rank {found.global_rank} is outside [0, {found.world_size - 1}] in the {found.kind} env.")
    return found
