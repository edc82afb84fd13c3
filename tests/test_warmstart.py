"""The tiny model's warm start: one cache entry for every seed of a sweep, and a progress bar while it trains."""

from __future__ import annotations

from conftest import TINY_ARCH, compose_train_cfg
from hydra.utils import instantiate


def _key(tmp_path, overrides):
    cfg = compose_train_cfg(tmp_path, overrides)
    return instantiate(cfg.model).cache_key(instantiate(cfg.data))


def test_seeds_share_one_warm_start_and_the_architecture_changes_it(tmp_path):
    base = _key(tmp_path, [])
    assert _key(tmp_path, ["seed=1"]) == base == _key(tmp_path, ["seed=7", "algo.beta=0.04"])
    assert _key(tmp_path, ["model.hidden_size=64"]) != base
    assert _key(tmp_path, ["data_seed=1"]) != base  # another split: other training rows
    assert _key(tmp_path, ["model.warmstart.seed=1"]) != base


def test_the_warm_start_draws_a_progress_bar_and_logs_one_line(capsys, caplog):
    from grpolab.models import TinyCharModel
    from grpolab.tasks.arithmetic import ArithmeticTask
    from grpolab.warmstart import warm_start

    spec = TinyCharModel(warmstart=None, **TINY_ARCH)
    tok = spec.load_tokenizer()
    rows = ArithmeticTask(val_size=8, test_size=8, max_value=9).splits()["train"]
    with caplog.at_level("INFO", logger="grpolab.warmstart"):
        report = warm_start(spec.load_policy(), tok, rows, target_accuracy=0.02, batch_size=16, eval_every=2,
                            num_heldout=16, max_steps=400, learning_rate=1e-2)
    err = capsys.readouterr().err
    assert "warm start:" in err and "acc=" in err and "steps (at most 400)" in err
    lines = [r.message for r in caplog.records if r.name == "grpolab.warmstart"]
    assert len(lines) == 1 and f"after {report['steps']} steps" in lines[0]


def test_a_warm_start_that_stops_improving_stops_early_with_advice_that_fits():
    """Answers unrelated to their prompts (random digits): no model can beat chance on held-out rows, so the warm
    start gives up once its accuracy has not risen for ``patience`` evaluations, long before ``max_steps``, and
    says what helps instead of "raise max_steps"."""
    import random

    import pytest

    from grpolab.models import TinyCharModel
    from grpolab.warmstart import warm_start

    spec = TinyCharModel(warmstart=None, **TINY_ARCH)
    rng = random.Random(0)
    rows = [{"uid": str(i), "prompt": f"{i}=", "answer": str(rng.randrange(1000, 10000))} for i in range(100)]
    with pytest.raises(RuntimeError) as err:
        warm_start(spec.load_policy(), spec.load_tokenizer(), rows, target_accuracy=0.25, batch_size=8,
                   eval_every=2, num_heldout=16, max_steps=2000, learning_rate=1e-2, patience=3)
    msg = str(err.value)
    assert "stopped improving" in msg and "more steps will not help" in msg and "raise" not in msg
    assert "model.warmstart.target_accuracy=0.25" in msg and "model.warmstart=null" in msg and "model=qwen0.5b" in msg
    stopped_at = int(msg.split("stopped at step ")[1].split(")")[0])
    assert stopped_at < 2000


def test_patience_is_not_in_the_cache_key(tmp_path):
    base = _key(tmp_path, [])
    assert _key(tmp_path, ["model.warmstart.patience=3"]) == base == _key(tmp_path, ["model.warmstart.patience=null"])
