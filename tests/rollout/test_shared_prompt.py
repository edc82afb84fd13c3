"""The shared-prompt forward and per-micro-batch padding trim give the plain forward's loss and gradients."""

import pytest
import torch

from grpolab.algo.losses import LossConfig, grpo_loss, loss_denominator
from grpolab.forward.logprob_pass import batched_log_probs, completion_log_probs
from grpolab.forward.shared_prompt import prompt_groups, supports_shared_prompt
from grpolab.rollout.engines.base import SamplingParams
from grpolab.rollout.engines.hf import HFGenerationEngine


def _loss_and_grads(model, batch, shared, micro_batch_size, temperature=0.7):
    """One GRPO step's loss and gradients, micro-batched as GRPOModule.training_step does."""
    model.zero_grad(set_to_none=True)
    n = batch["prompt_ids"].shape[0]
    cfg = LossConfig(beta=0.04)
    mask = batch["completion_mask"].float()
    denominator = loss_denominator(mask, "bnpo", batch["completion_ids"].shape[1])
    total, logps, ents = 0.0, [], []
    for s in range(0, n, micro_batch_size):
        rows = {k: v[s:s + micro_batch_size] for k, v in batch.items()}
        logp, ent = completion_log_probs(model, rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"],
                                         rows["completion_mask"], temperature, with_entropy=True,
                                         shared_prompt=shared)
        old = logp.detach() - 0.05  # a sampler that differs from the policy, so the ratio and clip matter
        loss, _ = grpo_loss(logp, old, old, rows["advantages"], rows["completion_mask"].float(), cfg,
                            denominator, old + 0.1)
        loss.backward()
        total += float(loss.detach())
        logps.append(logp.detach())
        ents.append(ent)
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return total, torch.cat(logps), torch.cat(ents), grads


def _assert_same(a, b, mask):
    assert abs(a[0] - b[0]) <= 1e-5 * max(1.0, abs(a[0]))
    assert torch.allclose(a[1][mask], b[1][mask], atol=1e-5)
    assert torch.allclose(a[2][mask], b[2][mask], atol=1e-5)
    assert a[3].keys() == b[3].keys() and len(a[3]) > 0
    for k in a[3]:
        assert torch.allclose(a[3][k], b[3][k], rtol=1e-4, atol=1e-6), k


class _PromptRows:
    """Counts the rows and tokens that reach the model's embedding (one forward call = one entry)."""

    def __init__(self, model):
        self.calls = []
        self.handle = model.get_input_embeddings().register_forward_hook(
            lambda mod, inp, out: self.calls.append(tuple(inp[0].shape)))


def _groups(tokenizer, texts, num_generations, engine, model, max_new_tokens):
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    torch.manual_seed(0)
    gen = engine.generate(model, [p for p in prompts for _ in range(num_generations)],
                          SamplingParams(temperature=0.7, max_new_tokens=max_new_tokens))
    n = gen.prompt_ids.shape[0]
    return {"prompt_ids": gen.prompt_ids, "prompt_mask": gen.prompt_mask, "completion_ids": gen.completion_ids,
            "completion_mask": gen.completion_mask, "advantages": torch.linspace(-1.5, 1.5, n)}


def test_shared_prompt_matches_plain_on_the_char_model(tiny_spec):
    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy()
    model.train()
    engine = HFGenerationEngine([tok.eos_token_id], tok.pad_token_id)
    # Prompts of different lengths (left padding), 4 completions each, stops at different places.
    batch = _groups(tok, ["12+7=", "3+4=", "100+250="], 4, engine, model, max_new_tokens=6)
    assert not batch["prompt_mask"].bool().all()  # left padding is exercised
    mask = batch["completion_mask"]
    plain = _loss_and_grads(model, batch, shared=False, micro_batch_size=12)
    counter = _PromptRows(model)
    shared = _loss_and_grads(model, batch, shared=True, micro_batch_size=12)
    counter.handle.remove()
    _assert_same(plain, shared, mask)
    # The prompt really ran once per distinct prompt (3 rows), not once per completion (12).
    assert counter.calls[0][0] == 3 and counter.calls[1][0] == 12
    # Micro-batches that split groups (sizes 5, 5, 2) and rows with a unique prompt fall back where needed.
    _assert_same(plain, _loss_and_grads(model, batch, shared=True, micro_batch_size=5), mask)
    _assert_same(plain, _loss_and_grads(model, batch, shared=True, micro_batch_size=1), mask)


def test_shared_prompt_matches_plain_on_qwen_with_chat_template(shared_data):
    from grpolab.models import TinyQwenModel

    spec = TinyQwenModel(tokenizer_path=str(shared_data / "qwen2.5-tokenizer"), seed=0)
    tok = spec.load_tokenizer()
    model = spec.load_policy()
    model.train()
    texts = [tok.apply_chat_template([{"role": "system", "content": "Answer with a number."},
                                      {"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in ("What is 2+2?", "Natalia sold clips to 48 of her friends in April. How many in May?")]
    engine = HFGenerationEngine(spec.stop_token_ids(tok), tok.pad_token_id)
    batch = _groups(tok, texts, 3, engine, model, max_new_tokens=5)
    mask = batch["completion_mask"]
    _assert_same(_loss_and_grads(model, batch, shared=False, micro_batch_size=6),
                 _loss_and_grads(model, batch, shared=True, micro_batch_size=6), mask)
    # The no-grad pass used for the sampler and reference log-probs agrees too.
    plain = batched_log_probs(model, batch, 0.7, None, shared_prompt=False)
    shared = batched_log_probs(model, batch, 0.7, None, shared_prompt=True)
    assert torch.allclose(plain[mask], shared[mask], atol=1e-5)


def test_padding_columns_are_trimmed_per_micro_batch(tiny_spec):
    model = tiny_spec.load_policy()
    torch.manual_seed(1)
    ids = torch.randint(3, 20, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    comp = torch.randint(3, 20, (2, 3))
    cmask = torch.ones(2, 3, dtype=torch.bool)
    with torch.no_grad():
        ref, _ = completion_log_probs(model, ids, mask, comp, cmask, 1.0)
        # The same rows inside a buffer padded 4 columns on the left and 6 on the right.
        pad_ids = torch.cat([torch.zeros(2, 4, dtype=torch.long), ids], 1)
        pad_mask = torch.cat([torch.zeros(2, 4, dtype=torch.long), mask], 1)
        pad_comp = torch.cat([comp, torch.zeros(2, 6, dtype=torch.long)], 1)
        pad_cmask = torch.cat([cmask, torch.zeros(2, 6, dtype=torch.bool)], 1)
        counter = _PromptRows(model)
        out, _ = completion_log_probs(model, pad_ids, pad_mask, pad_comp, pad_cmask, 1.0)
        counter.handle.remove()
    assert out.shape == (2, 9)
    assert torch.allclose(out[:, :3], ref, atol=1e-6) and bool((out[:, 3:] == 0).all())
    assert counter.calls == [(2, 8)]  # 5 prompt + 3 completion columns reach the model, not 18


def test_prompt_groups_and_fallbacks(tiny_spec):
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1]])
    first, inverse = prompt_groups(ids, mask)
    assert torch.equal(ids[first][inverse], ids) and sorted(first.tolist()) == [0, 2]
    # Same ids but a different mask is a different prompt.
    assert prompt_groups(ids[:2], torch.tensor([[0, 1, 1], [1, 1, 1]])) is None
    model = tiny_spec.load_policy()
    assert supports_shared_prompt(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert not supports_shared_prompt(model)


def test_shared_prompt_forward_is_validated():
    from grpolab.config import GRPOConfig

    with pytest.raises(ValueError, match="algo.shared_prompt_forward"):
        GRPOConfig(shared_prompt_forward="yes")


def test_length_buckets_match_one_pass(tiny_spec):
    from grpolab.forward.buckets import length_buckets

    model = tiny_spec.load_policy()
    model.train()
    torch.manual_seed(2)
    g, u, width = 4, 8, 40
    prompt_ids = torch.randint(3, 20, (u, 5)).repeat_interleave(g, 0)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[:g, :2] = 0  # one left-padded prompt
    lengths = torch.tensor([1, 2, 3, 40] * u)  # mostly short completions in a batch padded to 40
    completion_ids = torch.randint(3, 20, (g * u, width))
    completion_mask = torch.arange(width)[None] < lengths[:, None]
    buckets = length_buckets(prompt_ids, prompt_mask, completion_mask, shared_prompt=True)
    assert buckets is not None and sorted(torch.cat(buckets).tolist()) == list(range(g * u))
    mask = completion_mask
    results = []
    for max_buckets in (1, 4):
        model.zero_grad(set_to_none=True)
        counter = _PromptRows(model)
        logp, ent = completion_log_probs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.9,
                                         with_entropy=True, shared_prompt=True, max_buckets=max_buckets)
        counter.handle.remove()
        loss = (logp * mask).sum() / mask.sum() + ((logp * mask) ** 2).sum() / mask.sum()
        loss.backward()
        tokens = sum(rows * cols for rows, cols in counter.calls)
        results.append((float(loss), logp.detach(), ent, {k: p.grad.clone() for k, p in model.named_parameters()},
                        tokens))
    _assert_same(results[0][:4], results[1][:4], mask)
    assert results[1][4] < 0.6 * results[0][4]  # far fewer padded positions reach the model
