"""One long prompt must stop the run at setup, named, not OOM-kill it later.

The reported case: one 3,002-character row in a 40-row jsonl, ``algo.max_prompt_length: null``; the
kernel killed the run at 22.6 GB after 102 s with no message.
"""

from __future__ import annotations

import json
import types

import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoTokenizer

from grpolab.app.run import build, run_training
from grpolab.models import PretrainedModel
from grpolab.rollout.prompt_lengths import default_max_prompt_length


def _rows_file(tmp_path, long_at: int | None = 17, n: int = 40):
    path = tmp_path / "rows.jsonl"
    rows = []
    for i in range(n):
        a, b = i % 10, (i * 7) % 10
        prompt = f"{a}+{b}=" if i != long_at else "9" * 2998 + "+1="
        rows.append({"id": f"row{i}", "prompt": prompt, "answer": str(a + b) if i != long_at else "1" + "0" * 2998})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _data(path):
    return ["data=jsonl", f"data.path={path}", "data.uid_key=id", "data.val_size=4", "data.test_size=4"]


def test_one_long_row_is_named_before_the_first_step(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *_data(_rows_file(tmp_path)), "trainer.max_steps=1"])
    assert cfg.algo.max_prompt_length is None
    with pytest.raises(ValueError) as err:
        run_training(cfg)
    msg = str(err.value)
    assert "1 prompt(s) longer than algo.max_prompt_length=58 tokens" in msg
    assert "max_position_embeddings 64 - algo.max_completion_length 6" in msg
    assert "uid 'row17' in split" in msg and "3001 tokens" in msg
    assert not (tmp_path / "cache").exists()  # before the (tiny) model was built or warm-started


def test_every_split_is_checked(tmp_path):
    # The long row lands in val or test (not train) for some seeds: it is named wherever it is.
    for seed in range(6):
        cfg = compose_train_cfg(tmp_path / str(seed), [*FAST_OVERRIDES, *_data(_rows_file(tmp_path, long_at=seed)),
                                                      f"seed={seed}"])
        with pytest.raises(ValueError, match=rf"uid 'row{seed}' in split (train|val|test)"):
            build(cfg)


def test_without_long_rows_the_default_is_filled_in(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *_data(_rows_file(tmp_path, long_at=None)),
                                       "algo.max_completion_length=4"])
    parts = build(cfg)
    assert parts["algo"].max_prompt_length == 64 - 4
    assert parts["datamodule"].producer.cfg.max_prompt_length == 60  # the sampler enforces the same limit


def test_an_explicit_limit_is_kept_and_enforced(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *_data(_rows_file(tmp_path, long_at=None)),
                                       "algo.max_prompt_length=3"])
    with pytest.raises(ValueError, match=r"prompt\(s\) longer than algo.max_prompt_length=3 tokens \(set in the config\)"):
        build(cfg)


def test_default_from_a_real_model_folder_and_from_the_tokenizer(shared_data):
    folder = shared_data / "qwen2.5-tokenizer"  # config.json: max_position_embeddings 32768
    tok = AutoTokenizer.from_pretrained(folder)
    limit, why = default_max_prompt_length(PretrainedModel(path=str(folder)), tok, 256)
    assert limit == 32768 - 256 and "max_position_embeddings" in why
    no_config = types.SimpleNamespace(source=None)
    limit, why = default_max_prompt_length(no_config, tok, 256)
    assert limit == tok.model_max_length - 256 and "model_max_length" in why
    with pytest.raises(ValueError, match="algo.max_completion_length=40000 leaves no room"):
        default_max_prompt_length(PretrainedModel(path=str(folder)), tok, 40000)
