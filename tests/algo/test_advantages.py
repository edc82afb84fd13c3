"""Advantages: docs/guide/pitfalls.md #1, #2, #11 and the std/epsilon conventions."""

import doctest
import math

import pytest
import torch

import grpolab.algo.advantages as adv_mod
from grpolab.algo import compute_advantages, group_reward_summary

# One group (1, 0): mean 0.5, unbiased std sqrt(0.5) = 0.70711.
# Ours: 0.5 / sqrt(0.5 + 1e-4) = 0.5 / 0.707177 = 0.707036.  TRL: 0.5 / (0.707107 + 1e-4) = 0.707006.
A_OURS = 0.5 / math.sqrt(0.5 + 1e-4)


def test_doctests():
    assert doctest.testmod(adv_mod, extraglobs={"torch": torch}).failed == 0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_pitfall1_zero_variance_group_is_exact_zero(scale):
    res = compute_advantages(
        torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([3, 3, 3, 3]), scale, epsilon=0.0
    )
    assert torch.equal(res.advantages, torch.zeros(4))  # epsilon 0 would give 0/0 = NaN if not guarded
    assert res.zero_std.all()
    assert torch.equal(res.group_std, torch.zeros(4))


def test_pitfall1_round_off_constant_group_and_singleton():
    # 0.1 is not exact in binary: the fp32 std of seven 0.1s comes out 8e-9, not 0; zero_std must still
    # hold (we test max == min), and the advantage must be exactly 0.
    res = compute_advantages(torch.tensor([0.1] * 7 + [0.7]), torch.tensor([0] * 7 + [1]))
    assert torch.equal(res.advantages, torch.zeros(8))
    assert res.zero_std.all()  # includes the G = 1 group: zero_std, advantage 0
    assert res.group_valid_count.tolist() == [7] * 7 + [1]
    assert res.group_valid_count.dtype == torch.long


def test_pitfall2_groups_by_id_not_position():
    # rows [P1, P2, P1, P2]; P1 rewards (1, 0), P2 rewards (0, 0).
    res = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([11, 22, 11, 22]))
    expected = torch.tensor([A_OURS, 0.0, -A_OURS, 0.0])
    torch.testing.assert_close(res.advantages, expected)
    # A positional reshape into [[r0, r1], [r2, r3]] would give P2's row 1 -0.707 and P1's row 2 zero.
    assert res.advantages[1] == 0 and res.advantages[2] < -0.7
    assert res.zero_std.tolist() == [False, True, False, True]
    torch.testing.assert_close(res.group_mean, torch.tensor([0.5, 0.0, 0.5, 0.0]))


def test_group_ids_are_values_any_order_any_magnitude():
    r = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    ids = torch.tensor([10**12, 5, 10**12, 5, -3, -3])
    res = compute_advantages(r, ids)
    perm = torch.tensor([4, 2, 0, 5, 1, 3])
    res_p = compute_advantages(r[perm], ids[perm])
    torch.testing.assert_close(res_p.advantages, res.advantages[perm])
    torch.testing.assert_close(res.advantages[:4], torch.tensor([-A_OURS, A_OURS, A_OURS, -A_OURS]))


def test_pitfall11_excluded_rows_do_not_move_the_baseline():
    with_nan = compute_advantages(torch.tensor([1.0, 0.0, float("nan")]), torch.tensor([1, 1, 1]))
    without = compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([1, 1]))
    torch.testing.assert_close(with_nan.advantages[:2], without.advantages)
    assert with_nan.advantages[2] == 0  # excluded row: advantage 0, not NaN
    assert with_nan.group_valid_count.tolist() == [2, 2, 2]
    torch.testing.assert_close(with_nan.group_std[0], torch.tensor(math.sqrt(0.5)))
    # Had the row been scored 1 it WOULD move the group: mean 2/3, so row 0 is no longer +0.707.
    scored = compute_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1, 1, 1]))
    assert abs(scored.advantages[0].item() - A_OURS) > 0.1


def test_nan_rows_can_empty_or_shrink_a_group():
    r = torch.tensor([float("nan"), float("nan"), 1.0, float("nan")])
    res = compute_advantages(r, torch.tensor([0, 0, 1, 1]))
    assert torch.equal(res.advantages, torch.zeros(4))
    assert res.zero_std.all() and torch.isfinite(res.group_mean).all()
    assert res.group_valid_count.tolist() == [0, 0, 1, 1]


def test_unbiased_std_and_scale_none():
    # G=4, rewards (1,0,0,0): mean 0.25; unbiased var = (0.5625 + 3*0.0625)/3 = 0.25 -> std 0.5
    # (ddof=0 would give 0.433 and advantage 1.732).
    r, ids = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long)
    res = compute_advantages(r, ids)
    s = math.sqrt(0.25 + 1e-4)
    torch.testing.assert_close(res.advantages, torch.tensor([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]))
    torch.testing.assert_close(res.group_std, torch.full((4,), 0.5))
    none = compute_advantages(r, ids, scale_rewards="none")
    torch.testing.assert_close(none.advantages, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_scale_batch_uses_the_batch_std():
    # groups (1, 0) and (1, 1): batch rewards [1,0,1,1], mean 0.75, unbiased var (3*0.0625+0.5625)/3 = 0.25
    res = compute_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), "batch")
    a = 0.5 / math.sqrt(0.25 + 1e-4)  # 0.99980 (with the group std it would be 0.70704)
    torch.testing.assert_close(res.advantages, torch.tensor([a, -a, 0.0, 0.0]))


def test_epsilon_convention_paper_vs_trl():
    res = compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), epsilon=0.0)
    torch.testing.assert_close(res.advantages, torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)]))
    res = compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert res.advantages[0].item() == pytest.approx(0.707036, abs=1e-6)
    trl = (torch.tensor([1.0, 0.0]) - res.group_mean) / (res.group_std + 1e-4)
    assert trl[0].item() == pytest.approx(0.707006, abs=1e-6)


def test_dtypes():
    r64 = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert compute_advantages(r64, torch.tensor([0, 0])).advantages.dtype == torch.float64
    assert compute_advantages(r64.half(), torch.tensor([0, 0])).advantages.dtype == torch.float32


@pytest.mark.parametrize(
    ("rewards", "ids", "kwargs", "match"),
    [
        (torch.zeros(3), torch.zeros(2, dtype=torch.long), {}, "shape"),
        (torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long), {}, "shape"),
        (torch.zeros(2), torch.zeros(2), {}, "group_ids"),
        (torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), {}, "floating"),
        (torch.zeros(2), torch.zeros(2, dtype=torch.long), {"scale_rewards": "std"}, "algo.scale_rewards"),
        (torch.zeros(2), torch.zeros(2, dtype=torch.long), {"epsilon": -1.0}, "algo.advantage_epsilon"),
    ],
)
def test_validation(rewards, ids, kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(rewards, ids, **kwargs)


def test_group_reward_summary_split_all_correct_all_wrong():
    nan = float("nan")
    r = torch.tensor([1, 1, 0, 0, 1, 0, nan, nan, 0.5, 0.5, 1, nan])
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    s = group_reward_summary(r, ids)
    assert s["group_ids"].tolist() == [0, 1, 2, 3, 4, 5]
    assert s["zero_std"].tolist() == [True, True, False, True, True, True]
    assert s["all_correct"].tolist() == [True, False, False, False, False, True]
    assert s["all_wrong"].tolist() == [False, True, False, False, False, False]
    assert s["count"].tolist() == [2, 2, 2, 0, 2, 1]
    torch.testing.assert_close(s["mean"], torch.tensor([1.0, 0.0, 0.5, 0.0, 0.5, 1.0]))
    torch.testing.assert_close(s["std"][2], torch.tensor(math.sqrt(0.5)))


# ---------------------------------------------------------------- truncated and unscorable rows


def test_truncated_rows_out_of_the_loss_are_out_of_the_baseline():
    from grpolab.algo.advantages import rows_in_loss

    # Rewards [trunc 0, 1, 0, 0], scale_rewards=none: without the truncated row [0, 0.667, -0.333, -0.333]
    # (with it in the baseline, the bug: [-0.25, 0.75, -0.25, -0.25]).
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    truncated = torch.tensor([True, False, False, False, False, False, False, True])
    cmask = torch.ones(8, 3)
    adv, keep = rows_in_loss(rewards, ids, cmask, truncated, scale_rewards="none", mask_truncated_completions=True)
    torch.testing.assert_close(adv.advantages[:4], torch.tensor([0.0, 2 / 3, -1 / 3, -1 / 3]))
    assert keep[:, 0].tolist() == [0, 1, 1, 1, 1, 1, 1, 0]
    # group 1 without its truncated row: [1, 0, 1] -> mean 2/3; the batch std (scale=batch) also leaves it out
    torch.testing.assert_close(adv.advantages[4:], torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0]))
    adv_b, _ = rows_in_loss(rewards, ids, cmask, truncated, scale_rewards="batch", epsilon=0.0,
                            mask_truncated_completions=True)
    kept = rewards[~truncated]
    torch.testing.assert_close(adv_b.advantages[1], (1 - 1 / 3) / kept.std())
    # Without mask_truncated_completions the row is in the loss and so in the baseline.
    adv, keep = rows_in_loss(rewards, ids, cmask, truncated, scale_rewards="none")
    torch.testing.assert_close(adv.advantages[:4], torch.tensor([-0.25, 0.75, -0.25, -0.25]))
    assert keep.sum() == 24
    # Unscorable rows too, and a group left with one row is zero-std (masked under mask_zero_std_groups).
    r = torch.tensor([math.nan, 1.0, math.nan, 0.0])
    adv, keep = rows_in_loss(r, torch.tensor([0, 0, 0, 1]), torch.ones(4, 1), torch.tensor([False, False, True, False]),
                             mask_zero_std_groups=True, mask_truncated_completions=True)
    assert adv.zero_std.tolist() == [True, True, True, True] and keep.sum() == 0


def test_zero_std_threshold_for_non_binary_rewards():
    rewards = torch.tensor([0.50, 0.51, 0.50, 0.49, 1.0, 0.0, 0.5, 0.5])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    exact = compute_advantages(rewards, ids)  # default 0.0: only exactly equal rewards are zero-std
    assert exact.zero_std.tolist() == [False] * 8 and exact.advantages[1] > 0.5
    thr = compute_advantages(rewards, ids, zero_std_threshold=0.05)  # group 0 std = 0.0082 <= 0.05
    assert thr.zero_std.tolist() == [True] * 4 + [False] * 4
    assert torch.equal(thr.advantages[:4], torch.zeros(4))
    torch.testing.assert_close(thr.advantages[4:], exact.advantages[4:])
    assert group_reward_summary(rewards, ids, zero_std_threshold=0.05)["zero_std"].tolist() == [True, False]
    with pytest.raises(ValueError, match=r"algo\.zero_std_threshold"):
        compute_advantages(rewards, ids, zero_std_threshold=-0.1)
    from grpolab.config import GRPOConfig

    for bad in (-1.0, math.inf, "x"):
        with pytest.raises(ValueError, match=r"algo\.zero_std_threshold"):
            GRPOConfig(zero_std_threshold=bad)
