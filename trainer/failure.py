"""Making a failed distributed run readable: the root cause first, rank-prefixed, and secondary
"peer went away" / timeout errors from gloo or NCCL turned into one clear DistributedDesyncError.

Nothing here runs a collective (design rule 1 of docs/reliability.md): by the time an exception is
being reported, a peer may be dead.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from strategies.exceptions import DistributedDesyncError, TrainerError

_PACKAGES = {"trainer", "strategies", "callbacks"}
_PEER_GONE = ("connection closed", "connection reset", "broken pipe", "connection refused", "closed by peer",
              "socket closed", "communicator was aborted", "nccl error")
_TIMED_OUT = ("timed out", "timeout")
# The innermost of our own functions on the stack → what the rank was doing when the collective failed.
_WHERE = {
    "agree": "the step agreement (control plane all-reduce)",
    "_agree_step": "the step agreement (control plane all-reduce)",
    "backward": "backward (the gradient all-reduce)",
    "optimizer_step": "the optimizer step (sharded state exchange)",
    "save_checkpoint": "a checkpoint save",
    "save_sharded": "a sharded checkpoint save",
    "all_gather_object": "gathering per-rank state (checkpoint or metric names)",
    "all_reduce": "a metric all-reduce (sync_dist)",
    "broadcast_object": "a broadcast",
    "barrier": "a barrier",
    "step": "the forward pass (buffer broadcast or parameter all-gather)",
}


def _where(exc: BaseException) -> str:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).parent.name in _PACKAGES and frame.name in _WHERE:
            return _WHERE[frame.name]
    return "a collective"


def peer_failure(exc: BaseException, rank: int) -> DistributedDesyncError | None:
    """A DistributedDesyncError explaining `exc` when it is a lost-peer or timeout error, else None."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, TrainerError):
        return None
    text = str(exc).lower()
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if any(marker in text for marker in _PEER_GONE):
        return DistributedDesyncError(
            f"rank {rank} lost contact with another rank during {_where(exc)}: that rank died or was killed; its "
            f"own error (or the launcher's report of its exit) above is the root cause. Transport error: {first_line}"
        )
    if any(marker in text for marker in _TIMED_OUT):
        return DistributedDesyncError(
            f"rank {rank} timed out in {_where(exc)}: another rank is alive but did not join (hung, or running a "
            "different collective). The process group timeout bounds this wait; set it with "
            f"DDPStrategy(timeout=...). Transport error: {first_line}"
        )
    return None


def report(exc: BaseException, rank: int) -> None:
    """Print the error with every line prefixed by the rank, so the root cause is found among many ranks."""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in lines))  # one write: ranks do not interleave
    sys.stderr.flush()
