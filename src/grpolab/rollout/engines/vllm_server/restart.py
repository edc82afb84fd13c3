"""Restarting the vLLM server a run started, after it died (``rollout.server.max_restarts``).

A restart (:meth:`~grpolab.rollout.engines.vllm_server.engine.VLLMServerEngine.restart`) stops what is left of the old
server's process group, drops its connection, request threads and weight transport, and lets the next push start a
new server on the same devices, port setting and work folder (its output is appended to the same ``server.log``).
The refresh that failed then gives the new server the weights of its own sampler policy and samples its buffer
again (:mod:`grpolab.rollout.refresh`). It costs one server start-up (the first start's ``startup_s``: 20-60 s on
this project's CPU, minutes for a large model on GPU) plus the push, and the buffer's generation is done again.

What is identical to a run whose server never died: the weights the buffer is sampled from (bit for bit: the
failed refresh's push, i.e. the live policy of that step when synchronous, the kept CPU copy of the launch's push
under ``rollout.async_generation``, never the policy that trained since), the prompts, the round, every request's
sampling parameters and seed (drawn again from the same seeded RNG), the schedule (lags, policy versions), the
prompt order and the completion counters afterwards. What may differ: the sampled tokens and their log-probs, by the
server's own floating-point non-determinism (a new process, an empty prefix cache, other request batching; seeded
requests on batch-invariant kernels would repeat exactly), and the bookkeeping: ``weight_syncs`` and
``time/weight_sync`` count the new server's load, ``sampler_restarts`` counts the restart, the wall-clock times grow,
and ``server.log`` holds both servers' output. The in-process stand-in of ``tests/rollout/test_sampler_failure.py``
(deterministic sampling) ends bit for bit where an uninterrupted run ends.

Never restarted: a server given by ``rollout.server.url`` (the run does not own it), a server that never answered
``/health`` (a start-up failure is a configuration or machine problem that a restart repeats), a run with several
training processes (every rank would have to agree on the restart), and an error that is not the server's (a
prompt too long, a verifier error). Those stop the run through the sampler-failure path
(:mod:`grpolab.rollout.sampler_failure`).
"""

from __future__ import annotations

import logging

from grpolab.rollout.engines.vllm_server.process import ServerError

log = logging.getLogger(__name__)


class RestartBudget:
    """How many times the server this run started may still be restarted, and why a failure is not.

    Args:
        max_restarts: ``rollout.server.max_restarts`` (restarts per training process; a resumed run has them again).
        owned: the run starts the server (``rollout.server.url`` is null).

    Attributes:
        used: restarts so far in this process.
        served: a server this run started has answered ``/health`` at least once.
    """

    def __init__(self, max_restarts: int, owned: bool) -> None:
        self.max_restarts, self.owned = int(max_restarts), bool(owned)
        self.used = 0
        self.served = False

    def refusal(self, err: BaseException, world: int) -> str | None:
        """None when a server that failed with ``err`` may be restarted; else why not, naming the setting ("" when
        the failure is not the server's or the server never came up)."""
        if not isinstance(err, ServerError):
            return ""
        if not self.owned:
            return "not restarted (a server given by rollout.server.url is never restarted)"
        if not self.served:
            return ""
        if world > 1:
            return "not restarted (rollout.server.max_restarts applies to a run with one training process)"
        if self.used >= self.max_restarts:
            return ("not restarted (rollout.server.max_restarts=0)" if self.max_restarts == 0 else
                    f"not restarted again (rollout.server.max_restarts={self.max_restarts}, {self.used} used)")
        return None

    def use(self, err: BaseException, startup_s: float | None) -> None:
        """Count one restart and log it (a warning: a restart is never silent)."""
        self.used += 1
        first = " ".join(str(err).split("; last lines of")[0].split())[:300]  # the log's tail is in server.log
        took = f" (the first start took {startup_s:.0f} s)" if startup_s is not None else ""
        log.warning("the vLLM server this run started failed: %s; restarting it (%d of rollout.server.max_restarts="
                    "%d)%s, then sampling the failed buffer again", first, self.used, self.max_restarts, took)
