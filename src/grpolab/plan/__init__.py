"""The memory plan: what one training process will hold, computed from the config before any model is built.

:mod:`.memory` is the arithmetic (bytes per term, from a model shape and the run's sizes), :mod:`.devices` reads the
trainer's devices and precision, :mod:`.verdict` says fits / does not fit against ``plan.device_memory`` (or the
memory the run can see) with the settings that would make it fit, and :mod:`.from_config` maps a composed config to
a plan (the engine's own :meth:`~grpolab.rollout.engines.base.GenerationEngine.memory_needs` for the sampler),
prints it, and refuses a run that cannot fit.
"""
