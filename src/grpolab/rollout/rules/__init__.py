"""Refresh rules: when the sampler takes new weights (:mod:`grpolab.rollout.rules.base`)."""
