"""Test-only in-process engines around the real Hugging Face engines, built from the run's real tiny model:

* :class:`FailingHFEngine` / :class:`FailingCopyEngine`: ``generate`` raises at its ``fail_at_call``-th call (the
  in-process engine error of a dying sampler; every other call is the real engine's). The copy engine owns its
  weights, so it also runs under ``rollout.async_generation=true``.
* :class:`RestartingCopyEngine`: dies the same way, losing its weights as a killed server does, and can be restarted
  ``max_restarts`` times (empty: the next push or weight load gives it weights), as a started vLLM server can.
"""

from __future__ import annotations

from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine

DIED = "CUDA error: an illegal memory access was encountered (engine died)"


class _FailsAtCall:
    """Raises :data:`DIED` from the ``fail_at_call``-th ``generate`` (1-based); the engine it is mixed into does
    the rest."""

    def __init__(self, *args, fail_at_call: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_at_call, self.calls = int(fail_at_call), 0

    def generate(self, model, prompts, params):
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise RuntimeError(DIED)
        return super().generate(model, prompts, params)


class FailingHFEngine(_FailsAtCall, HFGenerationEngine):
    """The in-place HF engine, failing at one call."""


class FailingCopyEngine(_FailsAtCall, HFSamplerCopyEngine):
    """The copy-owning HF engine, failing at one call."""


class SamplerDied(RuntimeError):
    """The error of a sampler that died (the test's stand-in for a started server's ServerError)."""


class RestartingCopyEngine(HFSamplerCopyEngine):
    def __init__(self, *args, fail_at_call: int = 3, max_restarts: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_at_call, self.max_restarts, self.calls, self.used, self.dead = int(fail_at_call), max_restarts, 0, 0, False

    def generate(self, model, prompts, params):
        self.calls += 1
        if self.calls == self.fail_at_call or self.dead:
            self.dead = True
            raise SamplerDied(DIED)
        return super().generate(model, prompts, params)

    def can_restart(self, err):
        return isinstance(err, SamplerDied) and self.used < self.max_restarts

    def restart_note(self, err):
        return f"not restarted again ({self.used} of {self.max_restarts} used)" if isinstance(err, SamplerDied) else ""

    def restart(self, err):
        self.used += 1
        self.dead, self.sampler_model = False, None  # a new sampler, without weights until the next push
