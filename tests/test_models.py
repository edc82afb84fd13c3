"""Dropout is off in the policy and the reference, so the lag-0 importance ratio is exactly 1."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from grpolab.forward.logprob_pass import batched_log_probs, completion_log_probs
from grpolab.models import PretrainedModel, build_char_tokenizer, make_reference
from grpolab.rollout.engines.base import SamplingParams
from grpolab.rollout.engines.hf import HFGenerationEngine


def _gpt2_folder(path):
    """A small GPT-2 (dropout 0.1 everywhere, as GPT-2 ships) saved with the char tokenizer."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    assert cfg.resid_pdrop == cfg.attn_pdrop == cfg.embd_pdrop == 0.1
    GPT2LMHeadModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return PretrainedModel(path=str(path), dtype="float32")


def test_lag0_ratio_is_exactly_one_with_a_dropout_model(tmp_path):
    spec = _gpt2_folder(tmp_path)
    tok = spec.load_tokenizer()
    policy = spec.load_policy()
    assert all(m.p == 0.0 for m in policy.modules() if isinstance(m, torch.nn.Dropout))
    assert policy.config.resid_pdrop == policy.config.attn_pdrop == policy.config.embd_pdrop == 0.0
    engine = HFGenerationEngine(spec.stop_token_ids(tok), tok.pad_token_id)
    torch.manual_seed(0)
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "12+34=", "5+67="]] * 4
    gen = engine.generate(policy, prompts, SamplingParams(max_new_tokens=6))
    batch = {"prompt_ids": gen.prompt_ids, "prompt_mask": gen.prompt_mask, "completion_ids": gen.completion_ids,
             "completion_mask": gen.completion_mask}
    sampler = batched_log_probs(policy, batch, 1.0, None)  # the sampler pass (eval mode)
    reference = batched_log_probs(make_reference(policy), batch, 1.0, None)
    policy.train()  # the training pass
    logp, _ = completion_log_probs(policy, *batch.values(), 1.0)
    m = gen.completion_mask
    ratio = (logp.detach() - sampler)[m].exp()
    assert torch.equal(ratio, torch.ones_like(ratio)), (ratio.min(), ratio.max())
    assert torch.equal(reference[m], sampler[m])
