"""A policy-loss variant registered outside src/ trains end to end when selected with algo.clip_mode: its
own stats reach metrics.csv, its name reaches summary.json, and its own knob, declared only in its register call
(``options=``), is set from the command line as ``+algo.<knob>``."""

import json
import sys

import pandas as pd
import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.algo.policy_loss import POLICY_LOSSES
from grpolab.app.run import run_training

VARIANT_MODULE = '''
import torch

from grpolab.algo import register_policy_loss


@register_policy_loss("toy_drop", options=("drop_above",))
def reinforce_with_drop(inp, cfg):
    """REINFORCE, dropping the tokens whose pi/alpha is above algo.drop_above (default 1.5; counted in drop_sum)."""
    limit = 1.5 if cfg.drop_above is None else cfg.drop_above
    keep = inp.mask & ((inp.logp - inp.sampler_logp).exp() <= limit)
    per_token = torch.where(keep, -inp.advantages * inp.logp, torch.zeros_like(inp.logp))
    return per_token, {"drop_sum": (inp.mask & ~keep).sum().to(inp.logp.dtype).detach()}
'''


@pytest.mark.parametrize("knob, dropped", [(None, 0.0), ("+algo.drop_above=0.5", 1.0)])
def test_registered_variant_trains_from_the_command_line_key(tmp_path, monkeypatch, knob, dropped):
    # the variant lives in the user's own module, imported by the run through the `imports` key
    (tmp_path / "toy_drop_variant.py").write_text(VARIANT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "imports=[toy_drop_variant]", "algo.clip_mode=toy_drop",
                                           "trainer.max_steps=2", "val.at_start=false", "save_policy=false",
                                           "trainer.val_check_interval=100", *([knob] if knob else [])])
        run_training(cfg)
    finally:
        POLICY_LOSSES.pop("toy_drop", None)
        sys.modules.pop("toy_drop_variant", None)
    metrics = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"])
    # on-policy at lag 0 every pi/alpha is 1: nothing dropped at the default 1.5, everything at drop_above=0.5;
    # the clipped variants' ratio stats are absent
    assert len(metrics) == 2 and (metrics["train/drop_mean"] == dropped).all()
    assert (metrics["train/num_loss_tokens"] > 0).all() and "train/ratio/mean" not in metrics.columns
    assert json.loads((tmp_path / "summary.json").read_text())["clip_mode"] == "toy_drop"
