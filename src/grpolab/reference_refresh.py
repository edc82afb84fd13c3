"""``algo.ref_refresh_every``: when the module's frozen reference becomes the policy, and which version it holds.

The reference is the module's: :class:`~grpolab.module.GRPOModule` owns it and refreshes it here, after the
optimizer step that completes step ``N * ref_refresh_every`` and before the next minibatch is made. Its version is
the optimizer step whose policy weights it holds (0: the initial policy). The module publishes the version on its
:class:`~grpolab.handle.PolicyHandle`; every minibatch records the version whose log-probs it carries
(``Minibatch.reference_version``), so the rollout side re-scores the minibatches an older reference scored, and the
module checks each minibatch against its reference before training on it.
"""

from __future__ import annotations

from typing import Any


class ReferenceRefresh:
    """The refresh rule and the version of the reference.

    Args:
        every: ``algo.ref_refresh_every`` (None or 0: the reference never moves).

    Attributes:
        version: the optimizer step whose policy weights the reference holds (0 before any refresh).
    """

    def __init__(self, every: int | None) -> None:
        self.every = every or None
        self.version = 0

    def due(self, step: int) -> bool:
        """Whether the reference must become the policy before optimizer step ``step`` (steps taken so far): at
        every multiple of ``every`` after 0, once."""
        return self.every is not None and step > 0 and step % self.every == 0 and self.version < step

    def refresh_if_due(self, reference: Any, policy: Any, step: int) -> int:
        """Copy ``policy``'s weights into ``reference`` when :meth:`due` (no reference: nothing to do); returns the
        reference's version."""
        if reference is not None and self.due(step):
            reference.load_state_dict(policy.state_dict())
            self.version = step
        return self.version

    def check(self, minibatch: Any, step: int) -> None:
        """Refuse to train step ``step`` on a minibatch whose ``ref_logp`` another reference version scored (the data
        module re-scores those before it hands a minibatch over).

        Raises:
            RuntimeError: naming both versions.
        """
        if minibatch.ref_logp is not None and minibatch.reference_version != self.version:
            raise RuntimeError(f"step {step}: the minibatch's ref_logp are reference version "
                               f"{minibatch.reference_version}'s, the module's reference is version {self.version}")

    def state_dict(self) -> dict[str, int]:
        return {"reference_version": self.version}

    def load_state_dict(self, state: dict[str, Any], global_step: int) -> None:
        """Restore :meth:`state_dict` from the module's checkpoint entry, saved after ``global_step`` steps.

        A checkpoint written before the module owned the refresh has no ``reference_version``: its reference was
        refreshed last at the latest multiple of ``every`` below ``global_step`` (the data module refreshed it
        before that step's minibatch was made), so that is its version.
        """
        if "reference_version" in state:
            self.version = int(state["reference_version"])
        elif self.every is not None and global_step > 0:
            self.version = (global_step - 1) // self.every * self.every
        else:
            self.version = 0
