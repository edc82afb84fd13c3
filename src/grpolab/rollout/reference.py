"""Reset the reference model to the policy inside a rollout buffer (``algo.ref_refresh_every``).

The reference's log-probs are stored with each minibatch when the buffer is sampled. A refresh that falls
inside a buffer would otherwise leave up to ``steps_per_generation * num_iterations - 1`` steps on the old
reference's stored log-probs while the new weights sit unused. So the refresh also recomputes ``ref_logp`` of
every minibatch the buffer still has to serve (one no-grad forward each; refreshes are rare): the KL term of
every step after step ``N * ref_refresh_every`` is taken against the reference of that refresh, whatever
``steps_per_generation``. The recomputed log-probs go into the checkpoint with the buffer, so resume is exact.
"""

from __future__ import annotations

from typing import Any

from grpolab.rollout.forward import batched_log_probs


def refresh_reference(reference: Any, policy: Any, remaining: list[Any], cfg: Any) -> int:
    """Copy the policy's weights into ``reference`` and recompute ``ref_logp`` of the minibatches still to come.

    Args:
        reference: the frozen reference model.
        policy: the policy (its current weights become the reference).
        remaining: the minibatches later steps still use (:meth:`~grpolab.rollout.buffer.RolloutBuffer.remaining`),
            updated in place.
        cfg: :class:`~grpolab.config.GRPOConfig` (``temperature``, ``micro_batch_size``, ``shared_prompt_forward``).

    Returns:
        The number of minibatches whose ``ref_logp`` was recomputed.
    """
    reference.load_state_dict(policy.state_dict())
    for mb in remaining:
        mb.ref_logp = batched_log_probs(reference, mb.tensors(), cfg.temperature, cfg.micro_batch_size,
                                        cfg.shared_prompt_forward)
    return len(remaining)
