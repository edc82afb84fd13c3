"""Completion masks from the first stop token (docs/guide/pitfalls.md #5, #6, #7)."""

import doctest

import pytest
import torch

import grpolab.algo.masks as masks_mod
from grpolab.algo import completion_mask


def test_doctests():
    assert doctest.testmod(masks_mod, extraglobs={"torch": torch}).failed == 0


def test_pitfall5_pad_equals_eos():
    # pad = eos = 2: the first 2 is the real EOS (trained), the rest is padding.
    cm = completion_mask(torch.tensor([[5, 7, 2, 2, 2], [2, 2, 2, 2, 2]]), [2])
    assert cm.mask.long().tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]
    assert cm.truncated.tolist() == [False, False]
    assert cm.lengths.tolist() == [3, 1]
    assert cm.mask.dtype == torch.bool and cm.lengths.dtype == torch.long


def test_pitfall6_every_stop_id_counts():
    ids = torch.tensor([[11, 12, 32007, 0, 0], [11, 32001, 32000, 0, 0], [11, 12, 13, 32000, 0]])
    cm = completion_mask(ids, {32007, 32000, 32001})
    assert cm.mask.long().tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]
    assert cm.truncated.tolist() == [False, False, False]
    # Only EOS 32000 known: row 0 would look truncated.
    assert completion_mask(ids, [32000]).truncated.tolist() == [True, False, False]


def test_pitfall7_no_stop_token_kept_as_sampled_and_flagged():
    ids = torch.tensor([[4, 5, 6, 7], [4, 2, 0, 0]])
    before = ids.clone()
    cm = completion_mask(ids, [2])
    assert cm.mask.long().tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert cm.truncated.tolist() == [True, False]
    assert cm.lengths.tolist() == [4, 2]
    assert cm.mask.shape == ids.shape and torch.equal(ids, before)  # nothing appended or overwritten


def test_pad_value_not_a_stop_is_not_used():
    # pad 0 inside a completion without stop: the mask still runs to the end (not derived from pads).
    cm = completion_mask(torch.tensor([[9, 0, 0, 9]]), [1])
    assert cm.mask.all() and cm.truncated.item()


def test_edge_cases_and_validation():
    cm = completion_mask(torch.zeros(2, 0, dtype=torch.long), [2])
    assert cm.mask.shape == (2, 0) and cm.lengths.tolist() == [0, 0] and cm.truncated.all()
    with pytest.raises(ValueError, match="stop_token_ids"):
        completion_mask(torch.tensor([[1, 2]]), [])
    with pytest.raises(ValueError, match="completion_ids"):
        completion_mask(torch.tensor([1, 2]), [2])
    with pytest.raises(ValueError, match="completion_ids"):
        completion_mask(torch.tensor([[1.0, 2.0]]), [2])
