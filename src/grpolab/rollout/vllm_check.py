"""The start-up check of the in-process vLLM engine: after the first push, the engine's log-probs must match the
trainer's on a probe, so a sampler whose weights did not arrive (or arrived in another dtype) cannot pass."""

from __future__ import annotations

from typing import Any

import torch


def check_push(engine: Any, model: Any) -> dict[str, float]:
    """Compare the engine's log-probs with the trainer's on a probe after the first push.

    Args:
        engine: the :class:`~grpolab.rollout.vllm_engine.VLLMGenerationEngine` (its ``llm``, ``vllm`` module,
            ``_max_len`` and ``sync_check_tolerance``; None = 1e-3 for float32 weights, 0.05 for 16-bit ones).
        model: the policy whose weights were pushed.

    Returns:
        ``mean_abs_logp_difference``, ``max_abs_logp_difference`` and the ``tolerance`` applied.

    Raises:
        RuntimeError: if they differ by more than the tolerance (the push did not reach the engine's weights,
            e.g. a vLLM whose reload API differs, or the engine's dtype differs from the policy's).
    """
    from grpolab.rollout.forward import completion_log_probs
    from grpolab.rollout.vllm_engine import TESTED_VLLM_VERSIONS

    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(vocab, (n,), generator=g).tolist() for n in (5, 3)]
    temperature, new = 0.7, max(1, min(8, engine._max_len - 5))
    sp = engine.vllm.SamplingParams(temperature=temperature, top_p=1.0, top_k=0, max_tokens=new,
                                    ignore_eos=True, seed=0, logprobs=0, detokenize=False)
    outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], [sp] * len(prompts), use_tqdm=False)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    diffs = []
    try:
        with torch.no_grad():
            for p, out in zip(prompts, outs):
                ids = list(out.outputs[0].token_ids)
                engine_logp = torch.tensor([d[t].logprob for d, t in zip(out.outputs[0].logprobs, ids)])
                ones_p, ones_c = torch.ones(1, len(p), dtype=torch.long), torch.ones(1, len(ids), dtype=torch.long)
                trainer, _ = completion_log_probs(model, torch.tensor([p], device=device), ones_p.to(device),
                                                  torch.tensor([ids], device=device), ones_c.to(device), temperature)
                diffs.append((trainer[0].float().cpu() - engine_logp).abs())
    finally:
        model.train(was_training)
    diff = torch.cat(diffs)
    tol = engine.sync_check_tolerance
    if tol is None:
        tol = 1e-3 if next(model.parameters()).dtype == torch.float32 else 5e-2
    result = {"mean_abs_logp_difference": float(diff.mean()), "max_abs_logp_difference": float(diff.max()),
              "tolerance": tol}
    engine.sync_check = result  # kept on the engine also when the check fails
    if not float(diff.mean()) <= tol:
        raise RuntimeError(
            f"rollout=vllm: after pushing the policy's weights into vLLM {engine.vllm.__version__}, the engine's "
            f"log-probs differ from the trainer's by {float(diff.mean()):.3g} nats per token on average "
            f"(> rollout.sync_check_tolerance={tol}): the sampler would be stale or wrong. Either this vLLM's "
            f"in-memory weight reload differs from the tested {', '.join(TESTED_VLLM_VERSIONS)}, or "
            f"rollout.dtype differs from the policy's dtype.")
    return result


def _numpy_rng_state() -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        return None
    return np.random.get_state()


def _set_numpy_rng_state(state: Any) -> None:
    if state is not None:
        import numpy as np

        np.random.set_state(state)
