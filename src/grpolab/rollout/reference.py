"""Reset the reference model to the policy inside a rollout buffer (``algo.ref_refresh_every``; issue 9 item 6).

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


def remaining_minibatches(buffer: list[Any], position: int, num_iterations: int) -> list[Any]:
    """The minibatches of ``buffer`` that later steps still use, after ``position`` steps were served.

    Minibatch ``j`` serves steps ``j * num_iterations .. (j + 1) * num_iterations - 1`` of the buffer, so the
    next step uses minibatch ``position // num_iterations`` (possibly the current one, for its next iteration).

    Example:
        >>> remaining_minibatches(["a", "b", "c"], 1, 1), remaining_minibatches(["a", "b"], 1, 2)
        (['b', 'c'], ['a', 'b'])
    """
    return list(buffer[position // num_iterations:]) if position < len(buffer) * num_iterations else []


def refresh_reference(reference: Any, policy: Any, buffer: list[Any], position: int, cfg: Any) -> int:
    """Copy the policy's weights into ``reference`` and recompute ``ref_logp`` of the minibatches still to come.

    Args:
        reference: the frozen reference model.
        policy: the policy (its current weights become the reference).
        buffer: the data module's current buffer of minibatches (updated in place).
        position: steps served from ``buffer`` so far, including the current one.
        cfg: :class:`~grpolab.config.GRPOConfig` (``num_iterations``, ``temperature``, ``micro_batch_size``).

    Returns:
        The number of minibatches whose ``ref_logp`` was recomputed.
    """
    reference.load_state_dict(policy.state_dict())
    remaining = remaining_minibatches(buffer, position, cfg.num_iterations)
    for mb in remaining:
        mb.ref_logp = batched_log_probs(reference, mb.tensors(), cfg.temperature, cfg.micro_batch_size,
                                        cfg.shared_prompt_forward)
    return len(remaining)
