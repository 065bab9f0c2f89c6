"""Making a failed distributed run readable: the root cause first, rank-prefixed, and secondary
"peer went away" / timeout errors from gloo or NCCL turned into one clear DistributedDesyncError that names the rank
behind them (found by the strategy: strategies/comm/peer_failure.py).

Nothing here runs a collective (design rule 1 of docs/reliability.md): by the time an exception is being reported, a
peer may be dead. The one exception is the strategy's bounded check after a timeout, on a group kept for it.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from strategies.comm.agreement_board import BoardPeerLost, BoardTimeout
from strategies.exceptions import DistributedDesyncError, TrainerError
from strategies.launch.script_launcher import GRACEFUL_EXIT_CODES
from trainer.ranks.preemption import Interrupted

if TYPE_CHECKING:
    from trainer.trainer import Trainer

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C

_PACKAGES = {"trainer", "strategies", "callbacks"}
_PEER_GONE = ("connection closed", "connection reset", "broken pipe", "connection refused", "closed by peer",
              "socket closed", "communicator was aborted", "nccl error")
_TIMED_OUT = ("timed out", "timeout")
# The innermost of our own functions on the stack → what the rank was doing when the collective failed.
_WHERE = {
    "agree": "the step agreement (control plane all-reduce)",
    "wait_for_posts": "the step agreement (this machine's shared-memory board)",
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


def classify(exc: BaseException) -> Literal["lost", "timeout"] | None:
    """"lost": a peer's connection went away; "timeout": a peer did not join in time; None: neither."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, TrainerError):
        return None
    if isinstance(exc, BoardPeerLost):
        return "lost"
    if isinstance(exc, BoardTimeout):
        return "timeout"
    text = str(exc).lower()
    if any(marker in text for marker in _PEER_GONE):
        return "lost"
    if any(marker in text for marker in _TIMED_OUT):
        return "timeout"
    return None


def peer_failure(exc: BaseException, rank: int, finding: str | None = None,
                 bound: str = "the process group's timeout") -> DistributedDesyncError | None:
    """A DistributedDesyncError explaining `exc` when it is a lost-peer or timeout error, else None. `finding` names
    the rank behind it (the strategy's diagnosis); `bound` says how long the collective was allowed to wait."""
    kind = classify(exc)
    if kind is None:
        return None
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if kind == "lost":
        cause = finding or ("that rank died or was killed; its own error (or the launcher's report of its exit) above "
                            "is the root cause")
        return DistributedDesyncError(
            f"rank {rank} lost contact with another rank during {_where(exc)}: {cause}. Transport error: {first_line}"
        )
    cause = finding or "another rank is alive but did not join (hung, or running a different collective)"
    return DistributedDesyncError(
        f"rank {rank} timed out in {_where(exc)} after waiting {bound}: {cause}. Set the bound with "
        f"DDPStrategy(timeout=...) or its min_timeout / timeout_steps (docs/reliability.md). Transport error: "
        f"{first_line}"
    )


def report_early_exit(exc: BaseException, trainer: Trainer) -> None:
    """A rank leaving a run by SystemExit or KeyboardInterrupt says so (an orderly stop already did)."""
    if isinstance(exc, Interrupted) or (isinstance(exc, SystemExit) and exc.code in GRACEFUL_EXIT_CODES):
        return  # trainer/ranks/preemption.py printed where every rank stopped
    rank, where = trainer.global_rank, (f"{trainer.state.fn.value if trainer.state.fn else 'the run'} at global step "
                                        f"{trainer.global_step} (epoch {trainer.current_epoch})")
    if isinstance(exc, KeyboardInterrupt):
        _write(f"[rank {rank}] KeyboardInterrupt during {where}: stopped at once, without a checkpoint (a second "
               f"Ctrl-C, or Ctrl-C outside the training batches); the process exits with {INTERRUPTED_EXIT_CODE}.\n")
    elif trainer.world_size > 1:
        code = getattr(exc, "code", None)
        _write(f"[rank {rank}] SystemExit({code!r}) raised during {where}: this rank leaves the run while the other "
               "ranks are still in it, so they fail at their next collective. To stop training, set "
               "trainer.should_stop = True on every rank instead of calling sys.exit().\n")


def _write(text: str) -> None:
    sys.stderr.write(text)  # one write: lines of several ranks do not interleave
    sys.stderr.flush()


def report(exc: BaseException, rank: int) -> None:
    """Print the error with every line prefixed by the rank, so the root cause is found among many ranks."""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    _write("".join(f"[rank {rank}] {line}\n" for line in lines))
