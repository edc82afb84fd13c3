"""The rollout schedule: which step of a buffer trains on which minibatch, and when the next buffer is sampled.

One refresh samples ``k = algo.steps_per_generation`` minibatches; each serves ``i = algo.num_iterations``
optimizer steps in a row, so a buffer serves ``S = k*i`` steps and minibatch ``j`` serves the buffer's steps
``j*i .. (j+1)*i - 1``. ``position`` is the number of the buffer's steps served so far (0 .. S).

With ``rollout.async_generation`` buffer r+1 is sampled in the background from the weights pushed ``push_delay``
steps into buffer r, and the trainer's and sampler's threads share the cores until ``overlap_end``.

:class:`Schedule` is the only place that computes these numbers: the buffer, the refresh strategies, the
refresh rules, the settings' checks and the memory plan ask it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """The k x i serving schedule of a rollout buffer and the async timing of the next one.

    Args:
        steps_per_generation: k, minibatches per refresh.
        num_iterations: i, consecutive optimizer steps per minibatch.
        max_lag: ``rollout.max_lag``, the largest lag a served minibatch may have (None = no bound).
        overlap_steps: ``rollout.overlap_steps``, async: steps of a buffer that run beside the next buffer's
            generation (None = half a buffer, rounded up).

    Example:
        >>> s = Schedule(steps_per_generation=3, num_iterations=2)
        >>> s.steps_per_buffer, [s.minibatch(p) for p in range(6)], [s.iteration(p) for p in range(6)]
        (6, [0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1])
    """

    steps_per_generation: int
    num_iterations: int = 1
    max_lag: int | None = None
    overlap_steps: int | None = None

    @property
    def steps_per_buffer(self) -> int:
        """S = k x i: optimizer steps one refresh serves."""
        return self.steps_per_generation * self.num_iterations

    def minibatch(self, position: int) -> int:
        """The index of the minibatch that serves the buffer's step ``position``."""
        return position // self.num_iterations

    def iteration(self, position: int) -> int:
        """Which of its ``num_iterations`` uses of a minibatch the buffer's step ``position`` is (0 = first)."""
        return position % self.num_iterations

    def at_minibatch_boundary(self, position: int) -> bool:
        """True when the buffer's step ``position`` is a minibatch's first use (a buffer may end only there)."""
        return self.iteration(position) == 0

    def push_delay(self) -> int:
        """Async: steps into buffer r at which the sampler takes the weights for buffer r+1.

        Buffer r+1 is trained from step (r+1)S to (r+2)S-1; pushing at step rS + d gives lags S-d .. 2S-1-d, so
        d = 2S-1-max_lag keeps every lag <= max_lag. d = S means no overlap; no bound: d = 0.
        """
        if self.max_lag is None:
            return 0
        return min(max(0, 2 * self.steps_per_buffer - 1 - self.max_lag), self.steps_per_buffer)

    def overlap_end(self) -> int:
        """Async: the position in a buffer from which the trainer has waited for the next buffer and uses every
        core: ``push_delay() + overlap_steps`` (``overlap_steps`` None: half a buffer, rounded up)."""
        steps = self.overlap_steps if self.overlap_steps is not None else -(-self.steps_per_buffer // 2)
        return self.push_delay() + steps

    def next_buffer_needed(self, step: int, position: int, max_steps: int | None) -> bool:
        """Whether the run trains past the current buffer: it ends at step ``step + S - position``, before
        ``max_steps`` (None or negative: no limit)."""
        return max_steps is None or max_steps < 0 or step + self.steps_per_buffer - position < max_steps
