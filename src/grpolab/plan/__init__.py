"""The memory plan: what one training process will hold, computed from the config before any model is built.

:mod:`.memory` is the arithmetic (bytes per term, from a model shape and the run's sizes), :mod:`.sampler_memory`
the sampler's half, which each engine declares
(:meth:`~grpolab.rollout.engines.base.GenerationEngine.memory_needs`), :mod:`.devices` reads the trainer's
devices and precision, and :mod:`.verdict` says fits / does not fit against ``plan.device_memory`` (or the
memory the run can see) with the settings that would make it fit. Mapping a composed config to a plan, printing
it and refusing a run that cannot fit is the application's (:mod:`grpolab.app.plan_from_config`).
"""
