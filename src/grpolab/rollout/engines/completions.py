"""Turn an inference engine's sampled token ids and log-probs into a :class:`~grpolab.rollout.engines.base.Generation`
(shared by the in-process vLLM engine and the vLLM server engine)."""

from __future__ import annotations

import torch

from grpolab.algo.masks import completion_mask
from grpolab.rollout.engines.base import Generation, left_pad


def to_generation(prompts: list[list[int]], completions: list[list[int]], logps: list[list[float]] | None,
                  stop_token_ids: list[int], pad_token_id: int) -> Generation:
    """Pad the completions and mask each one up to and including its first stop token.

    Args:
        prompts: the prompts' token ids, unpadded (row ``i`` of the result continues prompt ``i``).
        completions: the sampled token ids of each completion, as the engine returned them.
        logps: the engine's log-prob of each sampled token (processed log-probs: ``log_softmax(logits / T)``), or
            None (greedy decoding: no log alpha).
        stop_token_ids: the ids that end a completion.
        pad_token_id: the id written after a completion's end.

    Returns:
        A CPU :class:`~grpolab.rollout.engines.base.Generation`; ``sampler_logp`` [B, L] float32 is 0 outside the mask,
        None when ``logps`` is None.
    """
    width = max(max((len(c) for c in completions), default=0), 1)
    n = len(completions)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    logp = torch.zeros((n, width), dtype=torch.float32)
    for i, comp in enumerate(completions):
        if comp:
            ids[i, :len(comp)] = torch.tensor(comp, dtype=torch.long)
            if logps is not None:
                logp[i, :len(comp)] = torch.tensor(logps[i][:len(comp)], dtype=torch.float32)
    # Mask per row on the unpadded tokens: the pad id may itself be a stop id (docs/guide/pitfalls.md #5).
    mask = torch.zeros((n, width), dtype=torch.bool)
    truncated = torch.zeros(n, dtype=torch.bool)
    for i, comp in enumerate(completions):
        cm = completion_mask(torch.tensor([comp or [pad_token_id]], dtype=torch.long), stop_token_ids)
        mask[i, :len(comp)] = cm.mask[0, :len(comp)].bool()
        truncated[i] = bool(cm.truncated[0]) if comp else True
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    return Generation(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                      truncated=truncated, sampler_logp=(logp * mask) if logps is not None else None)
