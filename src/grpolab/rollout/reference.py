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

from grpolab.forward.logprob_pass import batched_log_probs


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


def refresh_reference_if_due(models: Any, buffer: Any, cfg: Any, step: int, last: int, precision: Any) -> int:
    """At every multiple of ``algo.ref_refresh_every`` (step > 0, once per step), make the reference the policy and
    recompute the stored ``ref_logp`` of the buffer's remaining minibatches (:func:`refresh_reference`), so the KL
    term of every later step is taken against the new reference whatever k.

    Args:
        models: the :class:`~grpolab.handle.PolicyHandle` (``policy``, ``reference``; no reference: nothing to do).
        buffer: the :class:`~grpolab.rollout.buffer.RolloutBuffer` (its ``remaining()`` minibatches are updated).
        cfg: :class:`~grpolab.config.GRPOConfig`.
        step: the optimizer step about to run.
        last: the step of the previous refresh (0: none).
        precision: a callable giving the training forward's precision context.

    Returns:
        The step of the latest refresh: ``step`` if it refreshed now, else ``last``.
    """
    every = cfg.ref_refresh_every
    if not every or models.reference is None or step == 0 or step % every or last == step:
        return last
    with precision():
        refresh_reference(models.reference, models.policy, buffer.remaining(), cfg)
    return step
