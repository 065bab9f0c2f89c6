"""Who the other ranks are, and which of them broke the run: naming a dead or hung rank, and ending a hung one.

Why: when a collective fails, gloo says "Connection closed by peer [127.0.0.1]:4242" or "Timed out waiting 10000ms
for recv operation", which names no rank. Two pieces of torch's machinery fill the gap, both off the hot path:

- At setup every rank shares its process identity (host, pid namespace, pid, start time) with one
  `all_gather_object`. After a lost connection a rank checks which ranks *on its own machine* no longer exist.
- A small gloo group is created at setup and used only after a timeout: every rank that timed out enters
  `torch.distributed.monitored_barrier` on it, whose rank 0 lists the ranks that did not arrive (torch's own tool for
  naming the rank that did not join). After a timeout the gloo pairs of the group that timed out are closed
  ("Application timeout caused pair closure"), so the check cannot run on that group.

A rank named as hung and running on this machine is then SIGKILLed by the rank that named it: its collectives can
never complete, and a launcher would otherwise give it a long grace (torchrun's agent waits 30 s after SIGTERM before
it kills; a stopped process ignores SIGTERM).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# How long the check after a timeout waits for the other ranks (they time out within about the same second). gloo
# takes the wait of the other ranks' send/recv from the group's creation (a later set_timeout does not reach them).
CHECK_S = 5.0


@dataclass(frozen=True)
class PeerIdentity:
    """One rank's process: `space` names the pid namespace of one boot of one machine, so that a pid is only ever
    compared with pids of the same space; `started` (clock ticks after boot) guards against a reused pid."""

    rank: int
    host: str
    space: str
    pid: int
    started: str


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> str:
    stat = _read(f"/proc/{pid}/stat")
    try:
        return stat.rsplit(")", 1)[1].split()[19]  # field 22 of /proc/<pid>/stat: start time
    except IndexError:
        return ""


def this_process(rank: int) -> PeerIdentity:
    """This process's identity. Without /proc (not Linux) `space` is empty and no peer is ever treated as local."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pidns = ""
    space = f"{boot}/{pidns}" if boot and pidns else ""
    return PeerIdentity(rank, socket.gethostname(), space, os.getpid(), _started(os.getpid()))


def _alive(peer: PeerIdentity) -> bool:
    """Is the process still there (and still the same process)? Zombies count as gone."""
    stat = _read(f"/proc/{peer.pid}/stat")
    if not stat:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and (not peer.started or fields[19] == peer.started)


_per_group: dict[str, Any] = {}  # the default process group the peers below belong to, and those peers


class Peers:
    """The identities of every rank, and the group used to name the rank(s) that did not join after a timeout."""

    def __init__(self, me: PeerIdentity, table: list[PeerIdentity], check_group: Any) -> None:
        self.me = me
        self.table = table
        self.check_group = check_group

    @classmethod
    def gather(cls, rank: int) -> Peers:
        """Collective, at setup (every rank): share identities and create the check group. Once per process group:
        a script that runs many fits on one group (each with a new Trainer) must not open a new gloo group each time."""
        world = dist.group.WORLD
        if _per_group.get("world") is world:
            return _per_group["peers"]
        me = this_process(rank)
        table: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(table, me)
        try:
            group = dist.new_group(backend="gloo", timeout=timedelta(seconds=CHECK_S))
        except (RuntimeError, ValueError):  # no gloo in this build: ranks are still named after a lost connection
            group = None
        peers = cls(me, table, group)
        _per_group.update(world=world, peers=peers)
        return peers

    def is_local(self, rank: int) -> bool:
        peer = self.table[rank]
        return bool(self.me.space) and peer.space == self.me.space and rank != self.me.rank

    def describe(self, rank: int) -> str:
        peer = self.table[rank]
        where = "this machine" if self.is_local(rank) else f"host {peer.host}"
        return f"rank {rank} (pid {peer.pid} on {where})"

    def gone(self, within_s: float = 0.0, ignore: tuple[int, ...] = ()) -> list[int]:
        """Ranks on this machine whose process has ended (ranks elsewhere cannot be checked from here).

        `within_s` looks again, every 20 ms, until one has ended: a SIGKILLed process closes its sockets (which is
        how this rank learns of it) before the kernel marks it ended, and on a loaded machine that gap is long enough
        for a single look to find every peer still there. Ranks in `ignore` are neither reported nor waited for.
        """
        local = [r for r in range(len(self.table)) if self.is_local(r) and r not in ignore]
        deadline = time.monotonic() + within_s
        while True:
            ended = [r for r in local if not _alive(self.table[r])]
            if ended or not local or time.monotonic() >= deadline:
                return ended
            time.sleep(0.02)

    def missing_after_timeout(self) -> tuple[list[int], str]:
        """Enter the check every rank that timed out enters; returns (ranks that did not join, how it was decided).

        On rank 0 torch's monitored_barrier lists every rank that did not arrive. Another rank only learns whether
        rank 0 took its message: if not, rank 0 is the one that did not join; if so, rank 0's report names them.
        """
        if self.check_group is None:
            return [], "no check group"
        try:
            dist.monitored_barrier(self.check_group, timeout=timedelta(seconds=CHECK_S), wait_all_ranks=True)
        except RuntimeError as err:
            text = str(err)
            found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
            if found:
                return sorted(int(r) for r in found.group(1).replace(" ", "").split(",") if r), "seen by rank 0"
            if self.me.rank != 0 and "send operation" in text:
                return [0], "it never took this rank's message"
            return [], "rank 0's report names the rank(s) that did not join"
        return [], "every rank answered"

    def end(self, ranks: list[int]) -> list[int]:
        """SIGKILL the given ranks that run on this machine; returns the ones ended."""
        ended = []
        for rank in ranks:
            peer = self.table[rank]
            if self.is_local(rank) and _alive(peer):
                try:
                    os.kill(peer.pid, signal.SIGKILL)
                    ended.append(rank)
                except (ProcessLookupError, PermissionError):
                    pass
        return ended
