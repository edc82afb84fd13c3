"""Checkpoints: streamed to disk (:mod:`.io`), read safely and checked before a resume (:mod:`.reading`),
without the frozen weights a config rebuilds (:mod:`.frozen_weights`), and each rank's own rollout state
(:mod:`.rank_state`).
"""
