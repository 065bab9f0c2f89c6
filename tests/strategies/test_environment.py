"""Cluster environment detection is a pure function of the environment variables."""

from __future__ import annotations

import pytest

from strategies.exceptions import ConfigError
from strategies.launch.environment import detect_environment, first_slurm_host


def test_plain_local_run_launches_its_own_ranks():
    env = detect_environment(2, 1, {})
    assert (env.kind, env.external, env.world_size, env.global_rank) == ("local", False, 2, 0)


def test_torchrun_world_is_joined():
    env = detect_environment(2, 2, {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1",
                                    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert (env.kind, env.external, env.global_rank, env.local_rank, env.node_rank) == ("torchrun", True, 3, 1, 1)
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 1234)


def test_slurm_world_is_joined_with_master_from_the_node_list():
    env = detect_environment(4, 2, {"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
                                    "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4321"})
    assert (env.kind, env.global_rank, env.local_rank, env.node_rank) == ("slurm", 5, 1, 1)
    assert (env.master_addr, env.master_port) == ("gpu07", 14321)


def test_interactive_slurm_shell_is_not_a_slurm_job():
    env = detect_environment(1, 1, {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "bash"})
    assert env.kind == "local"


@pytest.mark.parametrize(("nodelist", "host"), [("node1", "node1"), ("gpu[03-05,07],cpu1", "gpu03"),
                                                ("a[9]", "a9"), ("x-1,x-2", "x-1")])
def test_first_slurm_host(nodelist: str, host: str):
    assert first_slurm_host(nodelist) == host


def test_world_size_mismatch_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"torchrun environment has WORLD_SIZE=4.*devices=2 x num_nodes=1 = 2"):
        detect_environment(2, 1, {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    with pytest.raises(ConfigError, match=r"slurm environment has SLURM_NTASKS=3"):
        detect_environment(2, 1, {"SLURM_NTASKS": "3", "SLURM_PROCID": "0"})


def test_more_processes_per_node_than_devices_is_an_error():
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=5 in the torchrun environment, but devices=4"):
        detect_environment(4, 8, {"RANK": "5", "WORLD_SIZE": "32", "LOCAL_RANK": "5"})


def test_manual_multi_node_needs_its_variables():
    with pytest.raises(ConfigError, match=r"num_nodes=2 without a launcher needs the environment variables"):
        detect_environment(1, 2, {"MASTER_ADDR": "127.0.0.1"})
    env = detect_environment(2, 2, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "5000", "NODE_RANK": "1"})
    assert (env.kind, env.external, env.global_rank, env.node_rank, env.world_size) == ("manual", False, 2, 1, 4)
    with pytest.raises(ConfigError, match=r"NODE_RANK=2 is outside \[0, 1\]"):
        detect_environment(1, 2, {"MASTER_ADDR": "a", "MASTER_PORT": "1", "NODE_RANK": "2"})
