"""The start-up check of the vLLM engines (in process, or a server): after the first push, the engine's log-probs must match the
trainer's on a probe, so a sampler whose weights did not arrive (or arrived in another dtype) cannot pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

TESTED_VLLM_VERSIONS = ("0.32.0",)  # the vLLM versions whose in-memory weight reload was checked

#: ``sample(prompts, temperature, max_tokens)`` -> one ``(token_ids, log_probs)`` per prompt: the engine's processed
#: log-probs (``log_softmax(logits / T)``) of the tokens it sampled, ``max_tokens`` each (the stop ids ignored).
ProbeSampler = Callable[[list[list[int]], float, int], list[tuple[list[int], list[float]]]]


@runtime_checkable
class CheckedEngine(Protocol):
    """What :func:`check_push` reads from an engine, and writes to it (public attributes, no private state).

    Attributes:
        sync_check_tolerance: the largest mean absolute log-prob difference allowed; None = 1e-3 for float32 weights,
            0.05 for 16-bit ones.
        sync_check: the last check's result (``mean_abs_logp_difference``, ``max_abs_logp_difference``,
            ``tolerance``), written by :func:`check_push`, also when the check fails.
        max_len: the engine's context length, prompt + completion tokens (0 = unknown); the probe samples at most
            ``max_len - 5`` tokens (and at most 8).
        probe_name: how the error names the engine (``rollout=vllm's vLLM 0.32.0``).
    """

    sync_check_tolerance: float | None
    sync_check: dict[str, float]
    max_len: int
    probe_name: str

    def probe(self, prompts: list[list[int]], temperature: float, max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """The engine's :data:`ProbeSampler` on its current weights."""


def check_push(engine: CheckedEngine, model: Any, sample: ProbeSampler | None = None,
               what: str | None = None) -> dict[str, float]:
    """Compare the engine's log-probs with the trainer's on a probe after the first push.

    Args:
        engine: the engine whose weights were pushed (:class:`CheckedEngine`).
        model: the policy whose weights were pushed.
        sample: the probe's sampler; None = ``engine.probe`` (another one: e.g. rank 0's samples broadcast to every
            rank under FSDP).
        what: the engine named in the error; None = ``engine.probe_name``.

    Returns:
        ``mean_abs_logp_difference``, ``max_abs_logp_difference`` and the ``tolerance`` applied.

    Raises:
        RuntimeError: if they differ by more than the tolerance (the push did not reach the engine's weights,
            e.g. a vLLM whose reload API differs, or the engine's dtype differs from the policy's).
    """
    from grpolab.forward.logprob_pass import completion_log_probs

    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(vocab, (n,), generator=g).tolist() for n in (5, 3)]
    temperature, new = 0.7, max(1, min(8, engine.max_len - 5))
    samples = (sample or engine.probe)(prompts, temperature, new)
    what = what or engine.probe_name
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    diffs = []
    try:
        with torch.no_grad():
            for p, (ids, logp) in zip(prompts, samples):
                engine_logp = torch.tensor(logp, dtype=torch.float32)
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
            f"after pushing the policy's weights into {what}, the engine's "
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
