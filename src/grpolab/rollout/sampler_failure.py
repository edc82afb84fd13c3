"""A sampler that dies loses nothing: the error a failed refill raises (:class:`SamplerFailure`); the Lightning
callback that saves ``last.ckpt`` at the last completed step when it does is
:class:`grpolab.callbacks.sampler_failure.SaveOnSamplerFailure`.

A refill that fails (a server that died, a failed push, a timeout, an in-process engine error) first puts back what
it had advanced (the prompt order, the rollout counters), so the state at the failure is the state at the end of
the last completed step, and then raises :class:`SamplerFailure`. The callback's ``on_exception`` (Lightning calls
it before its teardown) writes ``last.ckpt`` with ``trainer.save_checkpoint``, the save the signal path
(:mod:`grpolab.callbacks.interrupt`) uses; ``run_training`` then writes ``summary.json`` with ``"failed": true`` and
the reason, and ``src/train.py`` exits 1 with one line and the resume command.

A sampler the engine can restart (a vLLM server the run started: ``rollout.server.max_restarts``) is restarted
instead, and the failed buffer sampled again (:mod:`grpolab.rollout.refresh`); only a failure with no restart left
takes the path above. Under ``rollout.async_generation`` the background sampler's failure (or a buffer not
delivered within ``rollout.generation_timeout_s``) surfaces at the next step boundary that needs its buffer and
takes the same path; the checkpoint then holds that buffer as in flight, regenerated on resume.
"""

from __future__ import annotations

import traceback
from pathlib import Path


class SamplerFailure(RuntimeError):
    """The sampler failed while refilling the buffer before step ``step`` (``step`` steps are complete).

    Attributes:
        step: the optimizer steps completed. reason: the underlying error, on one line, led by ``note`` (why the
            sampler was not restarted, naming ``rollout.server.max_restarts``) when there is one.
        details: the underlying error's traceback (kept in ``summary.json``, not printed).
        ckpt_path: the ``last.ckpt`` written (None until :class:`SaveOnSamplerFailure` wrote it).
    """

    def __init__(self, step: int, err: BaseException, note: str = "") -> None:
        self.step = int(step)
        lead = f"{note}: " if note else ""
        self.reason = " ".join(f"{lead}{type(err).__name__}: {err}".split())[:2000]
        self.details = "".join(traceback.format_exception(err))
        self.ckpt_path: Path | None = None
        super().__init__(f"the sampler failed before step {self.step + 1}: {self.reason}")
