"""The per-step agreement of ranks that share one machine, through shared memory instead of a gloo round.

Why: gloo runs every collective, even a MAX of ten integers, on worker threads that it wakes on each rank. When
the ranks' compute already takes every core (CPU training), the woken threads take the CPU from the step: on 2 cores
one such round per step cost DDP about 5 % of a 17 ms step, overlapped or not (docs/benchmarks.md). Here each rank
posts its flags into its own slot of a small shared file, and reads every slot when it needs the result: a post and
a read take microseconds and wake nobody.

When a read can be served: every rank has posted this round. In the overlapped agreement (trainer/ranks/agreement.py)
the ranks post before backward and read after it, and the gradient all-reduce inside backward cannot finish before every
rank has reached its backward, so the read finds every post at once. Where nothing brought the ranks together (an
accumulation step without gradient sync, a rank out of data) the read waits for the missing posts, looking again
every few hundred microseconds, and fails as a collective would: at once when a missing rank's process has ended,
and after the hang bound when it is alive but does not post.

Layout: two rows of slots (rounds alternate between them), one slot per rank, each slot `[round, flags..., check]`.
A rank posts round r + 2 into the row of round r only after it read round r + 1, which every rank posted after
reading round r; so a row is never overwritten while a rank may still read it. The check (a hash of the round and
the flags, written before the round number) lets a reader reject a slot it caught half written.

Used only when every rank runs on this machine and the process group is gloo (CPU ranks). With NCCL the gradient
all-reduce does not make the host wait, and ranks on other machines cannot see this memory: there the agreement
stays a gloo round on the control group.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from array import array
from collections.abc import Callable

from strategies.comm import distributed

_SHM_DIR = "/dev/shm"  # memory-backed on Linux; elsewhere the system temp directory
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 50e-6, 2e-3  # how often a read that must wait looks again (doubling)
_LIVENESS_EVERY_S = 0.05  # how often a waiting read checks whether a missing rank's process has ended


class BoardPeerLost(RuntimeError):
    """A rank whose post this rank waits for has ended (the board's counterpart of a closed connection)."""


class BoardTimeout(RuntimeError):
    """A rank did not post within the hang bound (the board's counterpart of a collective timeout)."""


class AgreementBoard:
    """This machine's board: `post(flags)` starts a round, its `wait()` gives the element-wise MAX over the ranks.

    Args:
        buffer: the shared mapping (every rank maps the same file).
        rank, world: this rank and the number of ranks.
        width: the most flags a round carries (every rank posts the same number in a round).
        timeout_s: how long a read may wait for a missing post now (the hang bound in force).
        gone: which of the given ranks have ended (their process is no longer there).
    """

    def __init__(self, buffer: mmap.mmap, rank: int, world: int, width: int,
                 timeout_s: Callable[[], float], gone: Callable[[list[int]], list[int]]) -> None:
        self._buffer = buffer
        self._slots = memoryview(buffer).cast("q")
        self._rank, self._world, self._width = rank, world, width
        self._slot = width + 2
        self._timeout_s, self._gone = timeout_s, gone
        self._round = 0

    @staticmethod
    def size(world: int, width: int) -> int:
        return 8 * (1 + 2 * world * (width + 2))  # a token, then two rows of slots

    @classmethod
    def open(cls, rank: int, world: int, width: int, timeout_s: Callable[[], float],
             gone: Callable[[list[int]], list[int]]) -> AgreementBoard | None:
        """Collective, at setup, on every rank: rank 0 creates the file and every rank maps it; rank 0 removes its name
        once all have it open, so nothing is left behind whatever happens later. None (on every rank) when some rank
        could not map it: the agreement then stays a gloo round."""
        created = _create(cls.size(world, width)) if rank == 0 else None
        path, token = distributed.broadcast_object(created) or (None, 0)
        buffer = _map(path, token, cls.size(world, width)) if path else None
        failed = distributed.all_reduce_max_ints([int(buffer is None)])[0]
        if rank == 0 and path:
            os.unlink(path)
        if failed:
            if buffer is not None:
                buffer.close()
            return None
        assert buffer is not None
        return cls(buffer, rank, world, width, timeout_s, gone)

    def close(self) -> None:
        self._slots.release()
        self._buffer.close()

    def post(self, flags: list[int]) -> PendingPost:
        """Start a round: write this rank's flags (every rank starts the same rounds in the same order)."""
        count = len(flags)
        if count > self._width:
            raise ValueError(f"a round of the agreement board carries at most {self._width} flags, not {count}")
        padded = [*flags, *[0] * (self._width - count)]
        self._round = r = self._round + 1
        start = self._start(r) + self._rank * self._slot
        self._slots[start + 1:start + self._slot] = array("q", (*padded, hash((r, *padded))))
        self._slots[start] = r  # last: a reader takes the slot only once its round number is there
        return PendingPost(self, r, count)

    def _start(self, r: int) -> int:
        return 1 + (r & 1) * self._world * self._slot

    def read(self, r: int) -> tuple[list[list[int]], list[int]]:
        """(the flags of every rank that posted round r, the ranks that have not posted it yet)."""
        start, size = self._start(r), self._slot
        row = self._slots[start:start + self._world * size].tolist()
        posted, missing = [], []
        for rank in range(self._world):
            slot = row[rank * size:(rank + 1) * size]
            flags = slot[1:-1]
            if slot[0] == r and slot[-1] == hash((r, *flags)):
                posted.append(flags)
            else:
                missing.append(rank)
        return posted, missing

    def wait_for_posts(self, r: int) -> list[int]:
        """The MAX over every rank's flags of round r, waiting for ranks that have not posted it yet."""
        posted, missing = self.read(r)
        if missing:
            posted = self._await(r)
        return [max(column) for column in zip(*posted, strict=True)]

    def _await(self, r: int) -> list[list[int]]:
        now = time.monotonic()
        deadline, look_alive, pause = now + self._timeout_s(), now + _LIVENESS_EVERY_S, _FIRST_PAUSE_S
        while True:
            time.sleep(pause)
            pause = min(2 * pause, _LONGEST_PAUSE_S)
            posted, missing = self.read(r)
            if not missing:
                return posted
            now = time.monotonic()
            if now >= look_alive:
                look_alive = now + _LIVENESS_EVERY_S
                ended = self._gone(missing)
                if ended:
                    raise BoardPeerLost(
                        f"rank(s) {ended} on this machine ended before posting round {r} of the step agreement "
                        "(shared-memory board): their process is gone."
                    )
            if now >= deadline:
                raise BoardTimeout(
                    f"rank(s) {missing} did not post round {r} of the step agreement (shared-memory board) within "
                    f"{self._timeout_s():g} s: timed out."
                )


class PendingPost:
    """A round posted on the board; `wait()` gives the agreed flags (distributed.Pending)."""

    __slots__ = ("_board", "_round", "_count", "_agreed")

    def __init__(self, board: AgreementBoard, r: int, count: int) -> None:
        self._board, self._round, self._count = board, r, count
        self._agreed: list[int] | None = None

    def done(self) -> bool:
        """Whether every rank has posted this round (without waiting)."""
        return self._agreed is not None or not self._board.read(self._round)[1]

    def wait(self) -> list[int]:
        if self._agreed is None:
            self._agreed = self._board.wait_for_posts(self._round)[:self._count]
        return self._agreed


def _create(size: int) -> tuple[str, int] | None:
    """Rank 0: a new file of `size` zero bytes with a random token first; (path, token), or None when it cannot."""
    token = int.from_bytes(os.urandom(7), "little") + 1
    try:
        fd, path = tempfile.mkstemp(prefix="trainer-agreement-", dir=_SHM_DIR if os.path.isdir(_SHM_DIR) else None)
    except OSError:
        return None
    try:  # every byte written now: a full /dev/shm fails here, not later as a SIGBUS on a write to the mapping
        if os.pwrite(fd, token.to_bytes(8, "little") + bytes(size - 8), 0) != size:
            raise OSError("short write")
    except OSError:
        os.close(fd)
        os.unlink(path)
        return None
    os.close(fd)
    return path, token


def _map(path: str, token: int, size: int) -> mmap.mmap | None:
    """Map the board's file, or None when this rank cannot see it (another machine, another /dev/shm)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != size:
            return None
        buffer = mmap.mmap(fd, size)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if int.from_bytes(buffer[:8], "little") != token:
        buffer.close()
        return None
    return buffer
