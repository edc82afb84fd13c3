"""The rollout Schedule, method by method, against steps counted by hand; and the async lags its push delay gives
when a real RolloutBuffer serves buffers sampled at those steps."""

from __future__ import annotations

import pytest
import torch

from grpolab.rollout.buffer import Minibatch, RolloutBuffer
from grpolab.rollout.schedule import Schedule


def test_steps_per_buffer_is_k_times_i():
    assert Schedule(1).steps_per_buffer == 1
    assert Schedule(4).steps_per_buffer == 4
    assert Schedule(3, 2).steps_per_buffer == 6
    assert Schedule(10, 3).steps_per_buffer == 30


def test_minibatch_iteration_and_boundary_of_each_position():
    s = Schedule(steps_per_generation=3, num_iterations=2)  # minibatch j serves positions 2j, 2j+1
    assert [s.minibatch(p) for p in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [s.iteration(p) for p in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [s.at_minibatch_boundary(p) for p in range(6)] == [True, False, True, False, True, False]
    one = Schedule(steps_per_generation=4)  # i = 1: every step is a new minibatch
    assert [one.minibatch(p) for p in range(4)] == [0, 1, 2, 3]
    assert all(one.at_minibatch_boundary(p) for p in range(4))
    three = Schedule(2, 3)
    assert [three.minibatch(p) for p in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [three.at_minibatch_boundary(p) for p in range(6)] == [True, False, False, True, False, False]


@pytest.mark.parametrize("k,i,max_lag,delay", [
    (10, 1, None, 0),  # no bound: push at the buffer's first step
    (10, 1, 25, 0),  # 2S-1 = 19 <= 25: full overlap
    (10, 1, 19, 0),  # exactly 2S-1
    (10, 1, 14, 5),  # lags 10-5 .. 19-5 = 5 .. 14
    (10, 1, 9, 10),  # max_lag = S-1: no overlap (the push waits a whole buffer)
    (2, 2, 5, 2),  # S = 4: 2S-1-5 = 2, lags 2 .. 5
    (3, 2, 6, 5),  # S = 6: 11-6 = 5, lags 1 .. 6
])
def test_push_delay(k, i, max_lag, delay):
    assert Schedule(k, i, max_lag).push_delay() == delay


@pytest.mark.parametrize("schedule,end", [
    (Schedule(10), 0 + 5),  # half a buffer, rounded up
    (Schedule(3), 0 + 2),
    (Schedule(2, 2, max_lag=5), 2 + 2),  # push delay 2, then half of S = 4
    (Schedule(10, 1, max_lag=14, overlap_steps=3), 5 + 3),
    (Schedule(4, 1, overlap_steps=10), 10),  # more than a buffer: the split lasts the whole buffer
])
def test_overlap_end_is_the_push_delay_plus_the_overlap(schedule, end):
    assert schedule.overlap_end() == end


def test_next_buffer_needed_when_the_current_one_ends_before_max_steps():
    s = Schedule(2, 2)  # S = 4
    # at step 8, position 0: this buffer serves steps 8..11 and ends at step 12
    assert not s.next_buffer_needed(8, 0, max_steps=12)
    assert s.next_buffer_needed(8, 0, max_steps=13)
    # one step later (position 1) it still ends at step 12
    assert not s.next_buffer_needed(9, 1, max_steps=12)
    assert s.next_buffer_needed(9, 1, max_steps=13)
    assert s.next_buffer_needed(9, 1, max_steps=None) and s.next_buffer_needed(9, 1, max_steps=-1)


def _mb(version: int) -> Minibatch:
    z = torch.zeros(2, 1)
    return Minibatch(z.long(), z.long(), z.long(), z.bool(), torch.zeros(2, dtype=torch.bool),
                     torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.bool),
                     z, policy_version=version)


@pytest.mark.parametrize("k,i,max_lag,lags", [
    (2, 1, None, [2, 3]),  # async lags k*i .. 2k*i-1
    (2, 2, None, [4, 5, 6, 7]),
    (2, 2, 5, [2, 3, 4, 5]),  # pushed 2 steps into the buffer
    (3, 1, 2, [0, 1, 2]),  # max_lag = S-1: no overlap, the lags of a synchronous run
])
def test_async_lags_follow_the_push_delay(k, i, max_lag, lags):
    """Buffer r+1 is sampled from the weights of step r*S + push_delay and served by a real buffer from step
    (r+1)*S on: its lags are S-d .. 2S-1-d, never above max_lag."""
    s = Schedule(k, i, max_lag)
    buffer = RolloutBuffer(s)
    S, d = s.steps_per_buffer, s.push_delay()
    for r in range(3):  # buffers 1..3, the first served from step S
        buffer.fill([_mb(r * S + d)] * k)
        served = [buffer.next(step).lag for step in range((r + 1) * S, (r + 2) * S)]
        assert served == lags
        assert buffer.needs_refresh()
