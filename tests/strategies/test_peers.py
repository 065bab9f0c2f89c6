"""Naming the rank whose process ended: `Peers.gone` on real processes of this machine (no process group needed)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from strategies.comm.peers import PeerIdentity, Peers, this_process
from tests.helpers.tiers import allowed_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _peers_with(*children: subprocess.Popen) -> Peers:
    """This process as rank 0 and each child as the next rank, all on this machine."""
    me = this_process(0)
    table = [me] + [PeerIdentity(i + 1, me.host, me.space, c.pid, _start_of(c.pid))
                    for i, c in enumerate(children)]
    return Peers(me, table, check_group=None)


def _start_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def _sleeper(seconds: float) -> subprocess.Popen:
    with allowed_processes():  # a peer's pid to watch, not a run: the test stays in `make check`
        return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.mark.timeout(30)
def test_a_peer_that_ends_a_moment_after_the_look_is_still_named():
    """The race behind a flaky FI-19 run: the connection drops before the kernel marks the killed process ended."""
    late, alive = _sleeper(0.4), _sleeper(60)
    try:
        peers = _peers_with(late, alive)
        assert peers.gone() == []  # one look, too early: nothing to name
        assert peers.gone(within_s=10.0) == [1]  # not waiting for the `alive` one: it stops at the first end
    finally:
        for child in (late, alive):
            child.kill()
            child.wait()


@pytest.mark.timeout(30)
def test_an_unreaped_process_counts_as_ended_and_ignored_ranks_are_not_named():
    zombie, other = _sleeper(0), _sleeper(0)
    try:
        peers = _peers_with(zombie, other)
        deadline = time.monotonic() + 10
        while len(peers.gone()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # both exit at once but stay zombies: nobody has waited for them yet
        assert peers.gone() == [1, 2]
        assert peers.gone(within_s=1.0, ignore=(1,)) == [2]
        assert peers.gone(within_s=1.0, ignore=(1, 2)) == []  # nothing left to look at: no wait either
    finally:
        for child in (zombie, other):
            child.wait()


@pytest.mark.timeout(30)
def test_with_every_peer_alive_the_look_gives_up_after_its_bound():
    alive = _sleeper(60)
    try:
        peers = _peers_with(alive)
        start = time.monotonic()
        assert peers.gone(within_s=0.2) == []
        assert time.monotonic() - start >= 0.2
    finally:
        alive.kill()
        alive.wait()
