"""torch_threads: the default is applied before the model is built, and an oversubscribed machine is named."""

from __future__ import annotations

import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.callbacks.threads import ORIGINAL_THREADS, oversubscription_warning, resolve_torch_threads


def test_the_warning_fires_when_the_load_exceeds_the_cores():
    msg = oversubscription_warning(7.6, 2, 2)
    assert msg is not None and "oversubscribed" in msg and "7.6" in msg and "torch_threads=1" in msg
    assert "\n" not in msg
    assert oversubscription_warning(1.9, 2, 2) is None and oversubscription_warning(2.0, 2, 2) is None
    assert "fewer parallel runs" in oversubscription_warning(3.0, 2, 1)  # already one thread: say what helps


def test_auto_is_one_thread_for_the_embedded_models_only():
    assert resolve_torch_threads("auto", "grpolab.models.TinyCharModel") == 1
    assert resolve_torch_threads("auto", "grpolab.models.TinyQwenModel") == 1
    assert resolve_torch_threads("auto", "grpolab.models.PretrainedModel") is None
    assert resolve_torch_threads(3, "grpolab.models.TinyCharModel") == 3
    assert resolve_torch_threads(None, "grpolab.models.TinyCharModel") is None
    for bad in (0, -1, "many", True, 1.5):
        with pytest.raises(ValueError, match="torch_threads"):
            resolve_torch_threads(bad, "grpolab.models.TinyCharModel")


def test_the_default_config_runs_the_tiny_model_on_one_thread(tmp_path):
    from grpolab.app.run import build

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.max_steps=1"])
        assert cfg.torch_threads == "auto"
        build(cfg)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(ORIGINAL_THREADS + 1)  # as an earlier job of the same process (a multirun) may
        build(compose_train_cfg(tmp_path / "b", [*FAST_OVERRIDES, "torch_threads=null"]))
        assert torch.get_num_threads() == ORIGINAL_THREADS  # torch's default of this process, not the last job's
    finally:
        torch.set_num_threads(before)


def test_the_thread_count_moves_the_tiny_models_gradients_by_round_off_at_most():
    """What the docs say about determinism across thread counts, for the default tiny architecture: the same count
    gives the same bits; another count the same values up to round-off. Whether it gives the same bits, the kernels
    decide (yes on AMD AVX2 and Intel AVX-512's own kernels, not with AVX2-pinned kernels on Intel AVX-512: 2e-7 on
    the logits), so that is not asserted."""
    from grpolab.models import TinyCharModel

    spec = TinyCharModel(warmstart=None)
    tok = spec.load_tokenizer()
    ids = torch.tensor([tok("37+45=82", add_special_tokens=False)["input_ids"]] * 64)
    before = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            model = spec.load_policy()
            model.train()
            logits = model(input_ids=ids).logits
            logits.float().logsumexp(-1).mean().backward()
            out.append([logits.detach(), *(p.grad.clone() for p in model.parameters())])
    finally:
        torch.set_num_threads(before)
    one, two, one_again = out
    assert all(torch.equal(a, b) for a, b in zip(one, one_again, strict=True))
    for a, b in zip(one, two, strict=True):  # round-off is about 1e-6 of the largest entry; a real change is O(1)
        assert (a - b).abs().max() <= 1e-4 * a.abs().max(), (a - b).abs().max()
