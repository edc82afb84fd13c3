"""The generation engine: masks, stop ids, explicit sampling parameters, log-probs that match generate."""

import pytest
import torch

from grpolab.forward.logprob_pass import completion_log_probs
from grpolab.rollout.engines.base import SamplingParams, left_pad
from grpolab.rollout.engines.hf import HFGenerationEngine, _merge


def test_merge_keeps_truncation_when_pad_is_a_stop_id():
    # docs/guide/pitfalls.md #5: pad == eos == 1. Chunk A ran out of tokens ([5, 7], no stop); chunk B is wider.
    # Widening chunk A with pad=1 must not turn it into a stopped completion.
    a = (torch.tensor([[3, 4]]), torch.tensor([[1, 1]]), torch.tensor([[5, 7]]))
    b = (torch.tensor([[3]]), torch.tensor([[1]]), torch.tensor([[5, 1, 1, 1]]))
    gen = _merge([a, b], pad_id=1, stop_ids=[1])
    assert gen.truncated.tolist() == [True, False]
    assert gen.completion_mask.tolist() == [[True, True, False, False], [True, True, False, False]]
    assert gen.prompt_ids.tolist() == [[3, 4], [1, 3]] and gen.prompt_mask.tolist() == [[1, 1], [0, 1]]


def test_left_pad():
    ids, mask = left_pad([[7], [8, 9, 10]], pad_id=0)
    assert ids.tolist() == [[0, 0, 7], [8, 9, 10]] and mask.tolist() == [[0, 0, 1], [1, 1, 1]]


def test_sampling_ignores_model_generation_config(tiny_spec):
    # docs/guide/pitfalls.md #13: a model generation_config with top_k=1 would make every sample identical.
    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy()
    model.generation_config.top_k = 1
    model.generation_config.do_sample = False
    engine = HFGenerationEngine(tiny_spec.stop_token_ids(tok), tok.pad_token_id)
    torch.manual_seed(0)
    prompt = tok("12+34=")["input_ids"]
    gen = engine.generate(model, [prompt] * 32, SamplingParams(temperature=1.0, max_new_tokens=4))
    distinct = {tuple(r.tolist()) for r in gen.completion_ids}
    assert len(distinct) > 4


def test_training_log_probs_match_the_sampling_distribution(tiny_spec):
    # docs/guide/pitfalls.md #8: the sampler and the trainer use the same temperature transform and layout, so the
    # first on-policy ratio is 1 for every token (here within 1e-5 across left padding of varied prompts).
    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy().eval()
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "12+34=", "5+67=", "99+99="]]
    ids, mask = left_pad(prompts, tok.pad_token_id)
    torch.manual_seed(1)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_k=0, top_p=1.0,
                         max_new_tokens=5, output_logits=True, return_dict_in_generate=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    completion = out.sequences[:, ids.shape[1]:]
    ref = torch.stack(out.logits, 1).div(0.7).log_softmax(-1).gather(-1, completion[..., None])[..., 0]
    cmask = torch.ones_like(completion, dtype=torch.bool)
    with torch.no_grad():
        logp, _ = completion_log_probs(model, ids, mask, completion, cmask, temperature=0.7)
    first_stop = (completion == tok.eos_token_id).int().cumsum(1).cumsum(1) <= 1  # up to the first stop
    assert torch.allclose(logp[first_stop], ref[first_stop], atol=1e-5)
    # A wrong temperature is detectably different.
    with torch.no_grad():
        wrong, _ = completion_log_probs(model, ids, mask, completion, cmask, temperature=1.0)
    assert (wrong[first_stop] - ref[first_stop]).abs().max() > 1e-3


def _folder_with_generation_config(tmp_path, tiny_spec):
    """A saved model folder whose generation_config.json carries settings that would change sampling."""
    from grpolab.models import PretrainedModel

    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy()
    gc = model.generation_config
    gc.repetition_penalty, gc.no_repeat_ngram_size = 1.5, 2
    gc.temperature, gc.top_k, gc.top_p, gc.do_sample = 0.3, 3, 0.5, True
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return PretrainedModel(path=str(tmp_path), dtype="float32")


@pytest.mark.parametrize("greedy", [False, True])
def test_sampling_uses_our_config_alone_not_the_model_folders(tmp_path, tiny_spec, greedy):
    # generate() fills every unset setting from the folder's generation_config.json
    # (repetition_penalty, no_repeat_ngram_size, ...). The scores generate samples from must be exactly the
    # tempered distribution whose log-probs the trainer computes (training, validation and eval share this).
    spec = _folder_with_generation_config(tmp_path, tiny_spec)
    tok = spec.load_tokenizer()
    model = spec.load_policy()
    assert model.generation_config.repetition_penalty == 1.5  # the folder's settings did load
    engine = HFGenerationEngine(spec.stop_token_ids(tok), tok.pad_token_id)
    prompts = [tok(p)["input_ids"] for p in ["1+1=", "11+11=", "5+67=", "99+99="]] * 4
    temperature = 1.0 if greedy else 0.7
    torch.manual_seed(0)
    gen = engine.generate(model, prompts, SamplingParams(temperature=temperature, max_new_tokens=8,
                                                         do_sample=not greedy, return_log_probs=True))
    with torch.no_grad():
        logp, _ = completion_log_probs(model.eval(), gen.prompt_ids, gen.prompt_mask, gen.completion_ids,
                                       gen.completion_mask, temperature)
    m = gen.completion_mask
    assert m.sum() > 20
    assert torch.allclose(gen.sampler_logp[m], logp[m], atol=1e-5), (gen.sampler_logp[m] - logp[m]).abs().max()
    assert model.generation_config.repetition_penalty == 1.5  # the model's own config is restored
