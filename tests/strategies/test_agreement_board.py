"""The step agreement through this machine's shared-memory board (strategies/comm/agreement_board.py): the MAX it gives,
the waits it must do, how it fails, and that a 2-rank gloo fit uses it instead of a gloo round per step."""

from __future__ import annotations

import mmap
import threading
import time

import pytest
import torch

from strategies.comm import distributed
from strategies.comm.agreement_board import AgreementBoard, BoardPeerLost, BoardTimeout
from tests.helpers.boring import BoringModel, RandomDataset
from tests.helpers.dist import run_distributed
from trainer import Trainer
from trainer.ranks.failure import classify


def _boards(world: int = 2, width: int = 4, timeout_s: float = 5.0, gone: list[int] | None = None,
            buffer: mmap.mmap | None = None) -> list[AgreementBoard]:
    """One board per rank over one shared mapping, as the ranks of one machine have."""
    buffer = buffer or mmap.mmap(-1, AgreementBoard.size(world, width))
    ended = gone or []

    def gone_among(ranks: list[int]) -> list[int]:
        return [r for r in ranks if r in ended]

    return [AgreementBoard(buffer, rank, world, width, lambda: timeout_s, gone_among) for rank in range(world)]


def test_every_rank_reads_the_elementwise_max_of_the_posts():
    boards = _boards(world=3)
    pending = [board.post([rank + 1, -rank, 0]) for rank, board in enumerate(boards)]
    assert [p.done() for p in pending] == [True] * 3
    assert [p.wait() for p in pending] == [[3, 0, 0]] * 3


def test_rounds_alternate_rows_and_never_read_an_older_round():
    boards = _boards()
    for r in range(1, 6):
        first = boards[0].post([r, 0])
        assert not first.done()  # rank 1 has not posted round r: the slot holds round r - 2 (or nothing)
        second = boards[1].post([0, r])
        assert first.wait() == second.wait() == [r, r]


def test_a_read_waits_for_a_late_post():
    boards = _boards()
    pending = boards[0].post([1])
    late = threading.Timer(0.05, lambda: boards[1].post([7]))
    late.start()
    started = time.monotonic()
    assert pending.wait() == [7]
    assert 0.04 < time.monotonic() - started < 2.0
    late.join()


def test_a_rank_that_ended_without_posting_fails_the_read_at_once():
    boards = _boards(gone=[1])
    pending = boards[0].post([1])
    started = time.monotonic()
    with pytest.raises(BoardPeerLost, match=r"rank\(s\) \[1\] .* ended before posting round 1") as caught:
        pending.wait()
    assert time.monotonic() - started < 1.0
    assert classify(caught.value) == "lost"


def test_a_rank_that_never_posts_times_out_after_the_bound():
    boards = _boards(timeout_s=0.2)
    pending = boards[0].post([1])
    started = time.monotonic()
    with pytest.raises(BoardTimeout, match=r"rank\(s\) \[1\] did not post round 1 .* within 0.2 s") as caught:
        pending.wait()
    assert 0.2 <= time.monotonic() - started < 2.0
    assert classify(caught.value) == "timeout"


def test_a_half_written_slot_is_not_taken():
    buffer = mmap.mmap(-1, AgreementBoard.size(2, 4))
    boards = _boards(timeout_s=0.1, buffer=buffer)
    pending = boards[0].post([1, 2])
    # A torn write of rank 1: its round number is there, its flags and check not yet. Slots are width + 2 = 6
    # integers after a one-integer token; round 1 is in the second row (2 slots further), rank 1 in its second slot.
    memoryview(buffer).cast("q")[1 + 2 * 6 + 6] = 1
    assert not pending.done()
    with pytest.raises(BoardTimeout):
        pending.wait()


def test_a_round_carries_at_most_the_boards_width():
    with pytest.raises(ValueError, match="at most 4 flags, not 5"):
        _boards(width=4)[0].post([0] * 5)


# --- in a real 2-rank gloo fit ----------------------------------------------------------------------------


def _count_rounds(rank: int, board_allowed: bool) -> tuple[int, int, int]:
    """Fit 6 steps; (board posts, gloo rounds started, global step)."""
    counts = {"posts": 0, "gloo": 0}
    post, start = AgreementBoard.post, distributed.start_all_reduce_max_ints

    def counted_post(self: AgreementBoard, flags: list[int]) -> object:
        counts["posts"] += 1
        return post(self, flags)

    def counted_start(values: list[int], group: object = None) -> object:
        counts["gloo"] += 1
        return start(values, group)

    AgreementBoard.post = counted_post  # type: ignore[method-assign]
    distributed.start_all_reduce_max_ints = counted_start  # type: ignore[assignment]
    if not board_allowed:
        AgreementBoard.open = classmethod(lambda cls, *args: None)  # type: ignore[method-assign,assignment]
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, limit_train_batches=6,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    loader = torch.utils.data.DataLoader(RandomDataset(32, 64), batch_size=4)
    trainer.fit(BoringModel(), train_dataloaders=loader)
    return counts["posts"], counts["gloo"], trainer.global_step


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_ranks_on_one_machine_agree_through_the_board_not_a_gloo_round():
    assert run_distributed(_count_rounds, True, timeout=60) == [(6, 0, 6)] * 2


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_without_a_board_the_overlapped_round_is_a_gloo_all_reduce():
    assert run_distributed(_count_rounds, False, timeout=60) == [(0, 6, 6)] * 2
