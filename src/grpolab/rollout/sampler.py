"""The sampler (behaviour policy alpha): an engine plus the version of the policy weights it holds."""

from __future__ import annotations

import time
from typing import Any

import torch

from grpolab.rollout.engines.base import GenerationEngine


class SamplerPolicy:
    """Pushes the policy's weights into the engine once per refresh, and counts and times every push.

    Args:
        engine: the generation engine that samples the training rollouts.

    Attributes:
        version: the optimizer step whose weights the sampler holds (None before the first push).
        pushes: weight pushes so far (``weight_syncs`` in ``summary.json``).
        push_time_s: seconds spent in them.
        restarts: samplers restarted after a failure (``sampler_restarts`` in ``summary.json``; a resumed run
            adds to the checkpoint's count).
    """

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine
        self.version: int | None = None
        self.pushes = 0
        self.push_time_s = 0.0
        self.restarts = 0
        self._unreported_s = 0.0

    def push(self, policy: Any, step: int) -> None:
        """``engine.sync_weights(policy, step)``, unless the sampler already holds the weights of ``step``."""
        if self.version == step and self.pushes > 0:
            return
        start = time.perf_counter()
        self.engine.sync_weights(policy, step)
        took = time.perf_counter() - start
        self.pushes += 1
        self.push_time_s += took
        self._unreported_s += took
        self.version = step

    def restart(self, err: BaseException) -> bool:
        """Restart the engine's sampler after it failed with ``err``, if the engine can (``engine.can_restart``); the
        next push then reaches the new sampler (it is not skipped as a push of the version already held).

        Returns:
            False when the engine does not restart (the failure stops the run).
        """
        if not self.engine.can_restart(err):
            return False
        self.engine.restart(err)
        self.restarts += 1
        self.version = None  # the new sampler holds no weights yet
        return True

    def module(self, policy: torch.nn.Module) -> torch.nn.Module:
        """The module whose weights the sampler holds, for a trainer forward that recomputes log alpha: the engine's
        own copy, else ``policy`` (at refresh time the live policy holds the sampler's weights)."""
        own = self.engine.sampler_module()
        return own if own is not None else policy

    def take_push_time(self) -> float:
        """Seconds spent pushing since the last call (the step metric ``time/weight_sync``)."""
        took, self._unreported_s = self._unreported_s, 0.0
        return took

    def restore(self, state: dict[str, Any], like: Any, count: bool = False) -> None:
        """Load weights saved with a buffer in flight (``engine.load_sampler_state_dict``) and their version.
        ``count``: count and time it as a push (a restarted sampler's reload; a resume's restore is not counted)."""
        start = time.perf_counter()
        self.engine.load_sampler_state_dict(state["sampler_weights"], like=like)
        self.version = state["policy_version"]
        if count:
            took = time.perf_counter() - start
            self.pushes += 1
            self.push_time_s += took
            self._unreported_s += took

    def summary(self) -> dict[str, Any]:
        """``weight_syncs`` (pushes) and ``time_weight_sync_s`` for ``summary.json``."""
        return {"weight_syncs": int(self.pushes), "time_weight_sync_s": round(self.push_time_s, 4)}

    def state_dict(self) -> dict[str, Any]:
        return {"weight_syncs": self.pushes, "time_weight_sync_s": self.push_time_s, "sampler_version": self.version,
                "sampler_restarts": self.restarts}

    def load_state_dict(self, state: dict[str, Any], default_pushes: int = 0) -> None:
        self.pushes = state.get("weight_syncs", default_pushes)
        self.push_time_s = state.get("time_weight_sync_s", 0.0)
        self.version = state.get("sampler_version")
        self.restarts = state.get("sampler_restarts", 0)
