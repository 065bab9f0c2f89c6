"""The hang bound: the rule (strategies/comm/collective_timeout.py), how the trainer times batches
(trainer/ranks/step_clock.py), and that the bound really limits a collective's wait (2 forked CPU ranks, gloo)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from strategies import DDPStrategy, ZeroStrategy
from strategies.comm.collective_timeout import CollectiveTimeout
from strategies.exceptions import ConfigError
from tests.helpers.dist import run_distributed
from trainer.ranks.step_clock import StepClock


def test_the_rule_is_the_longer_of_the_floor_and_the_steps():
    rule = CollectiveTimeout(None, None, None)
    assert (rule.min_s, rule.steps) == (120.0, 20)
    assert rule.bound_for(0.01) == 120.0
    assert rule.bound_for(30.0) == 600.0
    tuned = CollectiveTimeout(None, timedelta(seconds=5), 10)
    assert tuned.bound_for(0.2) == 5.0 and tuned.bound_for(2.0) == 20.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"timeout": 30, "min_timeout": 5}, "timeout=30 fixes how long every collective waits"),
    ({"timeout": 30, "timeout_steps": 5}, "min_timeout and timeout_steps"),
    ({"min_timeout": 0}, "min_timeout=0 is not valid"),
    ({"min_timeout": "2m"}, "min_timeout='2m' is not valid"),
    ({"timeout_steps": 0}, "timeout_steps=0 is not valid"),
    ({"timeout_steps": 2.5}, "timeout_steps=2.5 is not valid"),
    ({"timeout": -1}, "timeout=-1 is not valid"),
])
def test_bad_hang_settings_are_refused_by_name(kwargs: dict[str, Any], message: str):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        DDPStrategy(**kwargs)


def test_zero_strategies_take_the_same_settings():
    strategy = ZeroStrategy(stage=2, min_timeout=30, timeout_steps=5)
    assert (strategy.collective_timeout.min_s, strategy.collective_timeout.steps) == (30.0, 5)
    assert DDPStrategy(timeout=timedelta(minutes=3)).timeout == timedelta(minutes=3)


def test_messages_say_where_the_bound_comes_from():
    assert CollectiveTimeout(12, None, None).describe() == "12 s (DDPStrategy(timeout=...))"
    rule = CollectiveTimeout(None, None, None)
    assert "torch's process-group default" in rule.describe()
    rule.attach([(None, timedelta(minutes=30))])
    assert rule.current_seconds() == 1800.0
    rule._groups = []  # no real group: only the bookkeeping is checked here
    rule.applied_s, rule.step_s = 120.0, 0.05
    assert rule.describe() == ("120 s (the hang bound: max(min_timeout=120 s, timeout_steps=20 x 0.05 s measured per "
                               "training batch))")


class _Strategy:
    def __init__(self, adapts: bool = True) -> None:
        self.calls: list[float | None] = []
        self.adapts = adapts

    def bound_collectives(self, step_s: float | None) -> bool:
        self.calls.append(step_s)
        return self.adapts


def test_the_clock_measures_on_growing_windows_and_pauses(monkeypatch: pytest.MonkeyPatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    strategy, clock = _Strategy(), StepClock()
    clock.start(strategy)
    seen = []
    for batch in range(12):  # one agreement per batch, 0.5 s apart
        clock.agreed(batch)
        seen.append(len(strategy.calls))
        now[0] += 0.5
    # window 1 (after batch 1), then windows of 2, 4, 8 batches: the strategy hears at batches 1, 3, 7
    assert seen == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]
    assert strategy.calls == [0.5, 0.5, 0.5]
    assert clock.pause() is True and strategy.calls[-1] is None
    assert clock.pause() is False  # already paused: nothing to undo
    clock.resume()
    assert strategy.calls[-1] == 0.5  # the last measurement applies again at once


def test_with_a_fixed_timeout_there_is_nothing_to_pause_or_resume(monkeypatch: pytest.MonkeyPatch):
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    strategy, clock = _Strategy(adapts=False), StepClock()
    clock.start(strategy)
    for batch in range(4):
        clock.agreed(batch)
        now[0] += 1.0
    assert clock.step_s == 1.0
    assert clock.pause() is False  # so no barrier is needed on the way out of a save or an evaluation


def test_the_clock_stays_silent_until_a_batch_was_measured():
    strategy, clock = _Strategy(), StepClock()
    clock.start(strategy)
    assert clock.pause() is False
    clock.resume()
    clock.agreed(0)
    assert strategy.calls == []


def _bounded_wait(rank: int) -> float:
    strategy = DDPStrategy(min_timeout=1.0, timeout_steps=1)
    strategy.global_rank, strategy.world_size = rank, 2
    dist.init_process_group("gloo", rank=rank, world_size=2)
    strategy.collective_timeout.attach([(dist.group.WORLD, timedelta(minutes=30))])
    dist.all_reduce(torch.ones(1))
    strategy.bound_collectives(0.01)  # max(1 s, 1 x 0.01 s) = 1 s
    if rank == 1:
        time.sleep(6)  # does not join in time
        return 0.0
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Timed out"):
        dist.all_reduce(torch.ones(1))
    waited = time.monotonic() - start
    strategy.bound_collectives(None)  # back to the group's own timeout
    assert strategy.collective_timeout.current_seconds() == 1800.0
    return waited


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_the_bound_limits_a_real_collective_wait():
    waited, _ = run_distributed(_bounded_wait)
    assert 0.9 <= waited < 4.0, waited
