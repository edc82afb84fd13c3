"""Rewards that make a test's learning signal certain by construction, on every processor.

A test that needs "the rewards of a group vary" (so advantages are non-zero, the policy moves, the KL and the drift
move) must not rest on what a warm start happens to learn: which completions a tiny model samples is decided by the
processor's kernels (AVX2 or AVX-512 matmuls round differently), so a lucky draw on one machine is a constant reward
on another. These functions score the completion's *text* by a hash: two different completions get different
rewards (a collision is a 1 in 2**32 event), and a random tiny model at temperature 1 samples different completions
within a group whatever the kernels. Rows can also be left constant by their ``uid``, which the data's seed alone
decides (integer operations, the same on every machine), so "this minibatch has no learning signal" is certain too.

Select one from a test with :data:`VARIED` (Hydra overrides; this folder is on ``sys.path`` under pytest).
"""

from __future__ import annotations

import zlib


class TextHashReward:
    """Reward ``crc32(completion) / 2**32`` in [0, 1): distinct completions score differently.

    Args:
        constant_every: when > 1, rows whose ``uid`` hashes to a multiple of it score 0.0 for every completion
            (their groups have zero reward variance: masked, no learning signal), decided by the data alone.
    """

    name = "text_hash"

    def __init__(self, constant_every: int = 0) -> None:
        self.constant_every = int(constant_every)

    def constant(self, uid: object) -> bool:
        """Whether every completion of the row with this ``uid`` scores 0.0."""
        return self.constant_every > 1 and zlib.crc32(str(uid).encode()) % self.constant_every == 0

    def __call__(self, completions: list[str], uid: list | None = None, **_) -> list[float]:
        """One reward per completion (a float in [0, 1)); ``uid`` (aligned with ``completions``) picks the constant
        rows when ``constant_every`` > 1."""
        uids = uid if uid is not None else [None] * len(completions)
        return [0.0 if self.constant(u) else zlib.crc32(str(c).encode()) / 2**32
                for c, u in zip(completions, uids, strict=True)]


# Hydra overrides that replace the task's verifier with TextHashReward and score truncated completions by their text
# too (a random tiny model rarely stops: with the default truncated_reward=0.0 most rewards would be equal).
VARIED = ["~verifier.reward_funcs.exact", "+verifier.reward_funcs.text_hash._target_=certain_reward.TextHashReward",
          "algo.truncated_reward=null"]


def varied(constant_every: int = 0) -> list[str]:
    """:data:`VARIED`, with ``constant_every`` (see :class:`TextHashReward`) when > 1."""
    extra = [f"+verifier.reward_funcs.text_hash.constant_every={constant_every}"] if constant_every > 1 else []
    return [*VARIED, *extra]
