"""What a rank says, and does, when one of its collectives failed because of another rank: the root cause first.

Why: after a peer dies, every survivor's collective fails with a transport error that names no rank, and those
errors used to come before the launcher's line naming the dead rank (which came last, at exit). Now:

- a lost connection: the rank hosting our launcher (rank 0 of `strategy="ddp"`) waits for the launcher's verdict,
  which the launcher prints as soon as a child ends; ranks our launchers started wait a moment so that the launcher's
  line comes first; and every rank names the ranks of its own machine whose process has ended
  (strategies/comm/peers.py);
- a timeout: every rank that timed out runs one bounded check that names the rank(s) that did not join, and ends
  those running on its machine once its error is printed (a launcher would give a stopped process 30 s or more).
"""

from __future__ import annotations

import os
import time
from typing import Any

from strategies.comm.peers import CHECK_S, Peers
from strategies.launch.parent_death import LAUNCHER_PID_VAR

LAUNCHER_WAIT_S = 2.0  # rank 0 of our own launcher: how long it waits to see which child ended
CHILD_DELAY_S = 1.0  # a rank our launcher started: lets the launcher's report of a dead rank come first
PEER_END_WAIT_S = 1.0  # the most a rank waits for a killed peer on its machine to be seen as ended (failure path only)


class PeerFailures:
    """The peers of this rank (gathered at setup) and the ranks found hung by the last check."""

    def __init__(self) -> None:
        self.peers: Peers | None = None
        self.launcher: Any = None  # our SubprocessLauncher when this process started the other local ranks
        self._hung: list[int] = []

    @property
    def ready(self) -> bool:
        return self.peers is not None

    def gather(self, rank: int, launcher: Any) -> None:
        """Collective, at setup, on every rank."""
        self.peers = Peers.gather(rank)
        self.launcher = launcher

    def all_on_this_machine(self) -> bool:
        """Whether every other rank runs on this machine, in this pid namespace (False before `gather`)."""
        peers = self.peers
        return peers is not None and all(peers.is_local(r) for r in range(len(peers.table)) if r != peers.me.rank)

    def ended(self, ranks: list[int]) -> list[int]:
        """Which of `ranks` (on this machine) have ended; one look, no wait."""
        if self.peers is None:
            return []
        return self.peers.gone(0.0, ignore=tuple(r for r in range(len(self.peers.table)) if r not in ranks))

    def diagnose(self, timed_out: bool) -> str | None:
        """A sentence naming the rank(s) behind a failed collective, or None when none could be named."""
        if self.peers is None:
            return None
        return self._missing() if timed_out else self._lost()

    def _lost(self) -> str | None:
        assert self.peers is not None
        parts, explained = [], []
        if self.launcher is not None:
            verdict = self.launcher.exit_report(LAUNCHER_WAIT_S)
            if verdict:
                parts.append(verdict)
                explained = self.launcher.child_ranks
        elif os.environ.get(LAUNCHER_PID_VAR):
            time.sleep(CHILD_DELAY_S)
        gone = self.peers.gone(PEER_END_WAIT_S, ignore=tuple(explained))
        if gone:
            parts.append(", ".join(self.peers.describe(r) for r in gone) + (" has" if len(gone) == 1 else " have")
                         + " ended")
        return "; ".join(parts) or None

    def _missing(self) -> str:
        assert self.peers is not None
        check_s = CHECK_S
        missing, how = self.peers.missing_after_timeout()
        if not missing:
            if how == "every rank answered":
                return (f"every rank answered a check {check_s:g} s long after the timeout, so none is hung: the "
                        "ranks were waiting in different collectives (a collective that not every rank ran)")
            return f"{how} (a {check_s:g} s check after the timeout)"
        self._hung = [r for r in missing if self.peers.is_local(r)]
        names = ", ".join(self.peers.describe(r) for r in missing)
        text = (f"{names} did not answer a {check_s:g} s check after the timeout ({how}): hung, stopped, or stuck "
                "outside the collectives")
        if self._hung:
            text += "; this rank ends it (SIGKILL), so that no launcher waits for a process that cannot take part"
        return text

    def end_hung(self) -> None:
        """SIGKILL the ranks on this machine that the last check found hung (after the error was printed)."""
        if self.peers is None:
            return
        for rank in self._hung:
            if self.launcher is None or not self.launcher.end_rank(rank):
                self.peers.end([rank])
        self._hung = []
