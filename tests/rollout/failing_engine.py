"""A test-only in-process engine whose ``generate`` raises at its ``fail_at_call``-th call (the in-process engine
error of a dying sampler; every other call is the real HF engine's)."""

from __future__ import annotations

from grpolab.rollout.engines.hf import HFGenerationEngine


class FailingHFEngine(HFGenerationEngine):
    def __init__(self, *args, fail_at_call: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_at_call, self.calls = int(fail_at_call), 0

    def generate(self, model, prompts, params):
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (engine died)")
        return super().generate(model, prompts, params)
