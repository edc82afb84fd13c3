"""A time bound per batch, not only per call.

Without it, N adversarial completions in one batch cost up to N x ``timeout_s``. With
``batch_timeout_s``, every completion cut by the bound scores None and is counted; the rest keep their
scores. Small bounds keep the test fast; assertions are on outcomes, not on timings.
"""

from __future__ import annotations

import pytest
from slow_funcs import regex_bomb_on_marker, spin_on_marker

from grpolab.verifiers.gsm8k import GSM8KVerifier
from grpolab.verifiers.reward import Verifier


def test_thread_path_cuts_the_batch_and_keeps_earlier_scores():
    # Per-call limit 1 s alone would let 6 hangs cost 6 s and score the trailing "ok" completions;
    # the batch bound of 1.5 s is hit during the 2nd hang: the 1st hang is a per-call timeout, the
    # 2nd and everything after it are batch timeouts. (Bounds of a few tenths of a second failed on a machine
    # at load 10: the "ok" calls themselves did not get the CPU in time.)
    rm = Verifier({"slow": spin_on_marker}, timeout_s=1.0, batch_timeout_s=1.5, num_workers=0)
    completions = ["ok", "ok", "HANG", "HANG", "HANG", "HANG", "HANG", "HANG", "ok", "ok"]
    out = rm(completions, answer=["1"] * len(completions))
    assert out.rewards[:3] == [1.0, 1.0, None]
    assert all(r is None for r in out.rewards[3:])
    assert out.num_timeouts == 1
    assert out.num_batch_timeouts == len(completions) - 3
    assert out.num_unscorable == len(completions) - 2
    assert out.metrics()["rewards/num_batch_timeouts"] == len(completions) - 3


def test_batch_bound_alone_without_a_per_call_limit():
    rm = Verifier({"slow": spin_on_marker}, timeout_s=None, batch_timeout_s=1.0, num_workers=0)
    out = rm(["ok", "HANG", "ok"], answer=["1"] * 3)
    assert out.rewards == [1.0, None, None]
    assert (out.num_timeouts, out.num_batch_timeouts, out.num_unscorable) == (0, 2, 2)


def test_a_cut_completion_is_cut_for_every_function_and_the_others_are_whole():
    # Completion by completion: a cut never leaves completion 0 half scored.
    rm = Verifier({"gsm8k": GSM8KVerifier(), "slow": spin_on_marker}, timeout_s=None, batch_timeout_s=1.0)
    out = rm(["#### 1", "#### 1 HANG", "#### 1"], answer=["1"] * 3)
    assert out.per_func["gsm8k"][0] == 1.0 and out.per_func["slow"][0] == 1.0
    assert out.rewards == [2.0, None, None]


def test_worker_processes_kill_a_hang_at_the_batch_bound():
    # A hang inside one C call (regex backtracking) with no per-call limit: only the batch bound stops it.
    # The bound includes worker start-up, so the worker is started first; the hang would run for centuries.
    rm = Verifier({"slow": regex_bomb_on_marker}, timeout_s=None, batch_timeout_s=3.0, num_workers=1)
    try:
        rm(["warm up"], answer=["1"])  # start the worker outside the measured batch
        out = rm(["ok", "HANG", "ok"], answer=["1"] * 3)
        assert out.rewards == [1.0, None, None]
        assert (out.num_batch_timeouts, out.num_unscorable) == (2, 2)
        again = rm(["ok", "ok"], answer=["1"] * 2)  # the killed worker was replaced
        assert again.rewards == [1.0, 1.0]
    finally:
        rm.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "abc"])
def test_bad_batch_timeout_names_the_key(bad):
    with pytest.raises(ValueError, match="verifier.batch_timeout_s"):
        Verifier({"gsm8k": GSM8KVerifier()}, batch_timeout_s=bad)
