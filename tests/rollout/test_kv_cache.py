"""The preallocated KV cache of the decode loop: the dynamic cache's tokens and log-probs, bit for bit, in place."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpolab.rollout.engines.base import SamplingParams, left_pad
from grpolab.rollout.engines.decode import sample_completions
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.engines.kv_cache import PreallocatedCache, PreallocatedLayer

PROMPTS = ["1+2=", "12+34=", "5+67=", "99+99=", "3+3="]


def _model(tiny_spec):
    tok = tiny_spec.load_tokenizer()
    model = tiny_spec.load_policy().eval()
    torch.manual_seed(0)
    for p in model.parameters():  # larger weights than the init: peaked distributions, rows that differ
        p.data.normal_(0, 0.5)
    return tok, model


def _stops(tok):
    return [tok.eos_token_id, tok("7")["input_ids"][-1], tok("1")["input_ids"][-1]]


def _both(model, ids, mask, stop, pad, n, **kwargs):
    out = {}
    for impl in ("dynamic", "preallocated"):
        gen = torch.Generator().manual_seed(3) if kwargs.get("do_sample", True) else None
        out[impl] = sample_completions(model, ids, mask, n, stop, pad, return_log_probs=True, generator=gen,
                                       cache_implementation=impl, **kwargs)
    return out["dynamic"], out["preallocated"]


@pytest.mark.parametrize("group", [1, 4])  # 1: every prompt distinct (no shared prefill); 4: groups of 4
def test_same_tokens_and_log_probs_as_the_dynamic_cache(tiny_spec, group):
    tok, model = _model(tiny_spec)
    ids, mask = left_pad([tok(p)["input_ids"] for p in PROMPTS for _ in range(group)], tok.pad_token_id)
    stop = _stops(tok)
    (tokens, logp), (tokens2, logp2) = _both(model, ids, mask, stop, tok.pad_token_id, 20, temperature=0.9)
    before_stop = (~torch.isin(tokens, torch.tensor(stop)).cumsum(1).bool()).sum(1)
    assert len(set(before_stop.tolist())) >= 3  # rows stop at (at least) three different steps
    assert torch.equal(tokens, tokens2)
    assert torch.equal(logp, logp2)  # exact: the attention reads the same values (a strided view)
    # Greedy, and sampling from torch's global RNG.
    (g1, l1), (g2, l2) = _both(model, ids, mask, stop, tok.pad_token_id, 20, do_sample=False)
    assert torch.equal(g1, g2) and torch.equal(l1, l2)
    runs = []
    for impl in ("dynamic", "preallocated"):
        torch.manual_seed(5)
        runs.append(sample_completions(model, ids, mask, 12, stop, tok.pad_token_id, 1.3, True, True,
                                       cache_implementation=impl))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_engine_setting_gives_the_same_generation(tiny_spec):
    tok, model = _model(tiny_spec)
    prompts = [tok(p)["input_ids"] for p in PROMPTS for _ in range(3)]
    gens = []
    for impl in ("dynamic", "preallocated"):
        engine = HFGenerationEngine(_stops(tok), tok.pad_token_id, cache_implementation=impl)
        params = SamplingParams(temperature=0.8, max_new_tokens=10, return_log_probs=True,
                                generator=torch.Generator().manual_seed(1))
        gens.append(engine.generate(model, prompts, params))
    assert torch.equal(gens[0].completion_ids, gens[1].completion_ids)
    assert torch.equal(gens[0].sampler_logp, gens[1].sampler_logp)
    with pytest.raises(ValueError, match="rollout.cache_implementation must be one of dynamic, preallocated"):
        HFGenerationEngine(_stops(tok), tok.pad_token_id, cache_implementation="static")


class _CacheCats(TorchDispatchMode):
    """Counts ``aten.cat`` along the sequence axis of 4-D tensors (a KV cache growing); rotary's cat is on -1."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.cat.default:
            tensors, dim = args[0], (args[1] if len(args) > 1 else 0)
            if tensors and tensors[0].dim() == 4 and dim in (2, -2):
                self.count += 1
        return func(*args, **(kwargs or {}))


def _decode_trace(model, ids, mask, stop, pad, n, impl):
    """Per decoding forward of the first layer: (data pointer, shape) of its cache's key buffer, and the cats."""
    seen = []

    def hook(module, args, kwargs):
        cache = kwargs["cache"] if "cache" in kwargs else kwargs["past_key_values"]
        layer = cache.layers[0]
        if layer.is_initialized and kwargs["hidden_states"].shape[1] == 1:  # decoding steps, not the prefill
            seen.append((layer.keys.data_ptr(), tuple(layer.keys.shape)))

    handle = model.model.layers[0].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with _CacheCats() as cats:
            tokens, _ = sample_completions(model, ids, mask, n, stop, pad, 1.0, True,
                                           generator=torch.Generator().manual_seed(3), cache_implementation=impl)
    finally:
        handle.remove()
    return seen, cats.count, tokens


def test_the_cache_is_preallocated_and_written_in_place(tiny_spec):
    tok, model = _model(tiny_spec)
    ids, mask = left_pad([tok(p)["input_ids"] for p in PROMPTS for _ in range(2)], tok.pad_token_id)
    stop, n = _stops(tok), 16
    seen, cats, tokens = _decode_trace(model, ids, mask, stop, tok.pad_token_id, n, "preallocated")
    assert len(seen) == tokens.shape[1] - 1 >= 5
    kv_heads, head_dim = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
    assert set(seen) == {(seen[0][0], (len(ids), kv_heads, ids.shape[1] + n - 1, head_dim))}  # one buffer
    assert cats == 0
    # The check has teeth: the dynamic cache reallocates and concatenates at every step.
    seen, cats, _ = _decode_trace(model, ids, mask, stop, tok.pad_token_id, n, "dynamic")
    assert len({ptr for ptr, _ in seen}) > 1 and cats >= len(seen)


def test_capacity_and_index_errors():
    layer = PreallocatedLayer(max_batch_size=2, max_cache_len=3)
    k = torch.zeros(2, 1, 2, 4)
    keys, values = layer.update(k, k + 1)
    assert keys.shape == (2, 1, 2, 4) and keys.data_ptr() == layer.keys.data_ptr() and values.eq(1).all()
    with pytest.raises(ValueError, match="exceed the preallocated 2 x 3"):
        layer.update(torch.zeros(2, 1, 2, 4), torch.zeros(2, 1, 2, 4))
    with pytest.raises(ValueError, match="update with 1 rows on a cache of 2"):
        layer.update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4))
    with pytest.raises(ValueError, match="row index 2 out of the 2 filled rows"):
        layer.batch_select_indices(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="3 rows exceed the preallocated 2"):
        layer.batch_select_indices(torch.tensor([0, 1, 1]))
    cache = PreallocatedCache(num_layers=1, max_batch_size=3, max_cache_len=4)
    cache.update(torch.arange(3.0).view(3, 1, 1, 1), torch.arange(3.0).view(3, 1, 1, 1), 0)
    cache.batch_select_indices(torch.tensor([0, 2]))  # row 1 stopped: row 2 moves up
    assert cache.layers[0].rows == 2 and cache.get_seq_length() == 1
    assert cache.layers[0].keys[:2, 0, 0, 0].tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="cache_implementation must be one of"):
        sample_completions(None, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1), 1, [0], 0,
                           cache_implementation="static")


@pytest.mark.parametrize("rollout", ["hf", "hf_copy"])
def test_the_setting_reaches_the_engine(tmp_path, rollout):
    from conftest import FAST_OVERRIDES, compose_train_cfg
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from grpolab.config import GRPOConfig
    from grpolab.rollout.settings import resolve_rollout

    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, f"rollout={rollout}"])
    assert cfg.rollout.cache_implementation == "dynamic"  # the default: not faster on this CPU (docs/guide/scale-out.md)
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, f"rollout={rollout}",
                                       "rollout.cache_implementation=preallocated"])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    _, args, _ = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)
    engine = instantiate(args, stop_token_ids=[0], pad_token_id=0)
    assert engine.cache_implementation == "preallocated"
    assert engine.validation_engine().cache_implementation == "preallocated"
