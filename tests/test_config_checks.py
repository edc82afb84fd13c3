"""Bad input gets a clear, early error naming the key, file, row, path or step."""

from __future__ import annotations

import json

import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import run_training


@pytest.mark.parametrize(
    "override,message",
    [
        ("algo.temperature=abc", r"algo\.temperature must be a number, got 'abc'"),
        ("algo.num_generations=abc", r"algo\.num_generations must be an integer, got 'abc'"),
        ("trainer.max_steps=abc", r"trainer\.max_steps must be an integer, got 'abc'"),
        ("algo.temperature=inf", r"algo\.temperature must be a finite number, got inf"),
        ("algo.learning_rate=nan", r"algo\.learning_rate must be a finite number"),
        ("trainer.log_every_n_steps=abc", r"trainer\.log_every_n_steps must be an integer or null"),
        ("data.val_size=abc", r"data\.val_size must be an integer"),
        ("val.num_generations=2.5", r"val\.num_generations must be an integer"),
        ("verifier.timeout_s=abc", r"verifier\.timeout_s must be"),
    ],
)
def test_wrong_types_name_the_key_before_any_model_is_built(tmp_path, override, message):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, override])
    with pytest.raises(ValueError, match=message):
        run_training(cfg)
    assert not (tmp_path / "cache").exists()  # the tiny model's warm-start cache: nothing was built


def test_a_missing_model_folder_says_so(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "model.path=/nonexistent/model"])
    with pytest.raises(Exception, match=r"model\.path=/nonexistent/model: the folder does not exist"):
        run_training(cfg)


def test_a_non_utf8_data_file_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    good = json.dumps({"prompt": "1+1=", "answer": "2"}).encode()
    path.write_bytes(b"\n".join([good] * 3 + [b'{"prompt": "caf\xe9 1+2=", "answer": "3"}', good]) + b"\n")
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "data=jsonl", f"data.path={path}", "data.val_size=1",
                                       "data.test_size=1"])
    with pytest.raises(ValueError, match=rf"{path}: line 4 is not valid UTF-8"):
        run_training(cfg)


@pytest.mark.parametrize("content,message", [(b"", "the checkpoint file is empty"),
                                             (b"PK\x03\x04 cut off", "not a PyTorch checkpoint")])
def test_a_broken_checkpoint_names_the_path(tmp_path, content, message):
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(content)
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, f"ckpt_path={ckpt}"])
    with pytest.raises(ValueError, match=rf"ckpt_path={ckpt}: {message}"):
        run_training(cfg)


def test_a_nan_reward_names_the_step_and_the_prompt(tmp_path, tiny_spec, arithmetic_task):
    from grpolab.config import GRPOConfig
    from grpolab.rollout.engines.hf import HFGenerationEngine
    from grpolab.rollout.producer import RolloutProducer
    from grpolab.verifiers.reward import Verifier

    def nan_reward(completions, **kwargs):
        return [float("nan")] * len(completions)

    cfg = GRPOConfig(num_generations=2, per_device_train_batch_size=4, max_completion_length=3)
    tok = tiny_spec.load_tokenizer()
    policy = tiny_spec.load_policy(arithmetic_task)
    engine = HFGenerationEngine(stop_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    producer = RolloutProducer(cfg, arithmetic_task, tok, engine, Verifier({"nan": nan_reward}, timeout_s=None))
    rows = arithmetic_task.splits()["train"][:2]
    with pytest.raises(ValueError, match=r"step 7: reward of completion 0 \(prompt '.+'\) is nan"):
        producer.produce(policy, None, rows, round_index=0, policy_version=7)
