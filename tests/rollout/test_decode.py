"""The decode loop that drops finished rows gives generate's completions (greedy) and distribution."""

import torch

from grpolab.forward.logprob_pass import completion_log_probs
from grpolab.rollout.engines.base import SamplingParams, left_pad
from grpolab.rollout.engines.decode import sample_completions
from grpolab.rollout.engines.hf import HFGenerationEngine


def _prompts(tok):
    return [tok(p)["input_ids"] for p in ["1+2=", "12+34=", "5+67=", "99+99=", "3+3="]]


def _hf_greedy(model, ids, mask, stop, pad, n):
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                         eos_token_id=stop, pad_token_id=pad)
    return out[:, ids.shape[1]:]


def test_greedy_matches_generate_with_left_padding_and_early_stops(tiny_spec):
    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy().eval()
    torch.manual_seed(0)
    for p in model.parameters():  # larger weights than the init, so greedy completions differ between rows
        p.data.normal_(0, 0.5)
    ids, mask = left_pad(_prompts(tok), tok.pad_token_id)
    free = _hf_greedy(model, ids, mask, [tok.eos_token_id], tok.pad_token_id, 8)
    # Make rows stop at different steps: the stop ids are tokens that some rows emit early on.
    stop = sorted({int(free[1, 1]), int(free[0, 2]), tok.eos_token_id})
    ref = _hf_greedy(model, ids, mask, stop, tok.pad_token_id, 8)
    calls = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    got, _ = sample_completions(model, ids, mask, 8, stop, tok.pad_token_id, do_sample=False)
    handle.remove()
    assert torch.equal(got, ref)
    assert min(calls) < len(ids)  # rows that stopped were no longer computed


def test_engine_samples_match_the_training_distribution(tiny_spec):
    # docs/guide/pitfalls.md #8 for the loop: the tokens it samples are scored by the trainer's forward; the loop's own
    # tempered log-probs (recomputed step by step here) must equal the training log-probs.
    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy().eval()
    engine = HFGenerationEngine([tok.eos_token_id, 7], tok.pad_token_id)
    torch.manual_seed(0)
    gen = engine.generate(model, [p for p in _prompts(tok) for _ in range(4)],
                          SamplingParams(temperature=0.7, max_new_tokens=6))
    assert gen.completion_mask.sum(1).min() < gen.completion_mask.sum(1).max()  # early stops happened
    stops = torch.isin(gen.completion_ids, torch.tensor([tok.eos_token_id, 7]))
    after = gen.completion_mask.logical_not() & (gen.completion_ids != tok.pad_token_id)
    assert not after.any()  # padding after the stop, as generate writes it
    assert (stops & gen.completion_mask).sum(1).le(1).all()
    with torch.no_grad():
        logp, _ = completion_log_probs(model, gen.prompt_ids, gen.prompt_mask, gen.completion_ids,
                                       gen.completion_mask, 0.7)
        # Teacher-forced full-sequence log-probs, token by token (the plain path, no cache).
        full = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
        attn = torch.cat([gen.prompt_mask, gen.completion_mask.long()], 1)
        logits = model(input_ids=full, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
        p = gen.prompt_ids.shape[1]
        ref = (logits[:, p - 1:-1] / 0.7).log_softmax(-1).gather(-1, gen.completion_ids[..., None])[..., 0]
    m = gen.completion_mask
    assert torch.allclose(logp[m], ref[m], atol=1e-5)


def test_group_prompts_are_prefilled_once(tiny_spec):
    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy().eval()
    torch.manual_seed(0)
    for p in model.parameters():
        p.data.normal_(0, 0.5)
    ids, mask = left_pad([p for p in _prompts(tok) for _ in range(3)], tok.pad_token_id)  # groups of 3
    ref = _hf_greedy(model, ids, mask, [tok.eos_token_id], tok.pad_token_id, 6)
    calls = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    got, logp = sample_completions(model, ids, mask, 6, [tok.eos_token_id], tok.pad_token_id, do_sample=False,
                                   return_log_probs=True)
    handle.remove()
    assert torch.equal(got, ref)
    assert calls[0] == (5, ids.shape[1]) and calls[1][0] == 15  # 5 distinct prompts, then 15 rows decode
    # Sampling: while no row has stopped (stop id 999 is outside the vocabulary), the loop draws exactly what generate draws (same RNG calls on the
    # same [15, V] probabilities, the first row of each group from its expanded prompt distribution).
    torch.manual_seed(1)
    hf = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.8, top_k=0, top_p=1.0,
                        max_new_tokens=4, eos_token_id=[999], pad_token_id=tok.pad_token_id)  # 999: never drawn
    torch.manual_seed(1)
    drawn, _ = sample_completions(model, ids, mask, 4, [999], tok.pad_token_id, 0.8, True)
    assert torch.equal(drawn, hf[:, ids.shape[1]:])
