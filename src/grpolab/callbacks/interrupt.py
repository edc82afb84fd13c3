"""Runs that survive interruption: Ctrl-C (SIGINT), SIGTERM (what SLURM sends) or SIGHUP (a terminal or ssh session
that closes) stops training at the next step boundary with a resumable ``last.ckpt``; a second signal aborts at once.

``run_training`` wraps ``trainer.fit`` .. ``summary.json`` / ``policy/`` in a :class:`StopOnSignal` (installed as a
context manager and as a Lightning callback). The signal handler only records the signal; the callback checks it
in ``on_train_batch_end`` (every rank at the same step, see below), saves ``checkpoints/last.ckpt`` with
``trainer.save_checkpoint`` (the same state a ``ModelCheckpoint(every_n_train_steps=...)`` save holds at that point,
so a resume from it is exact) and raises :class:`TrainingInterrupted`, which Lightning passes through its
``on_exception`` hooks and teardown. ``run_training`` catches it, writes ``summary.json`` (``"interrupted": true``,
``"signal"``, ``"steps"``) and ``policy/``, and ``src/train.py`` exits with 128 + the signal number (130 for
SIGINT, 143 for SIGTERM, 129 for SIGHUP). Once the terminal is gone, nothing written to the console can stop
the save (:mod:`grpolab.app.console`).

Several processes (DDP/FSDP): each rank's flag is max-reduced over the ranks at every step boundary, so when only
rank 0 gets the signal (``kill <pid>``) every rank still stops at the same step, saves its part of the checkpoint
and writes nothing else twice; no rank waits in a collective the others never reach. A second signal on one rank
aborts that rank at once (and, under Lightning's subprocess launcher, kills the ranks it launched, as Lightning
does on Ctrl-C); other ranks started by torchrun/SLURM then fail at their next collective
(``trainer.strategy.timeout``) unless they got the signal too, as a terminal Ctrl-C or SLURM's SIGTERM delivers it.

Validation outside ``fit`` (the one at start, the last one after training) and the final eval stop too: a stop
recorded there is checked (max-reduced over the ranks, as above) after every batch and raises
:class:`TrainingInterrupted` with no checkpoint, and ``run_training`` skips what follows. Before any training step
nothing is saved but ``summary.json`` (``"interrupted": true``, ``"steps": 0``) and ``policy/``: the run is
restarted by its own command. After the last training step (``last.ckpt`` holds it) the run is finished: the
summary says ``"interrupted": false`` with the ``"signal"`` and where it stopped (``"stopped_in"``), and the process
exits 0 (``src/eval.py ckpt_path=...`` scores it).

Lightning installs its own SIGTERM handler at the start of every ``fit``/``validate``, over ours; under DDP it
broadcasts from inside the handler (``_SignalConnector._sigterm_notifier_fn``), which hangs a rank whose peers did
not get the signal, and its loops then raise ``SIGTERMException`` (a ``SystemExit`` with status 0) that skips our
save. :meth:`StopOnSignal.attach` re-installs our handlers right after Lightning's registration (its SIGUSR1 SLURM
requeue handler, when enabled, stays).

Other code that wants a stop (e.g. a SLURM requeue signal) calls :meth:`StopOnSignal.request_stop`: the same path,
without the abort-on-second-signal rule.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn

from grpolab.sweep_signals import pending_signal

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C; kill and SLURM; a terminal or ssh that drops


class TrainingInterrupted(Exception):
    """Raised at a step boundary after a signal, once ``last.ckpt`` is written.

    Attributes:
        signum: the signal number (the one any rank received; the largest if ranks got different ones).
        step: the optimizer steps done (``trainer.global_step``).
        ckpt_path: the checkpoint written; None when raised outside training (a validation or the final eval
            outside ``fit``), where nothing is saved.
    """

    def __init__(self, signum: int, step: int, ckpt_path: Path | None) -> None:
        where = f"saved {ckpt_path}" if ckpt_path else "outside training, nothing to checkpoint"
        super().__init__(f"{signal.Signals(signum).name} at step {step}; {where}")
        self.signum, self.step, self.ckpt_path = signum, step, ckpt_path


class StopOnSignal(L.Callback):
    """Record SIGINT/SIGTERM; at the next training step boundary save ``last.ckpt`` and raise
    :class:`TrainingInterrupted`. A second signal restores the default action and re-sends itself (abort now).

    Use as ``with stop:`` around fit and the writing of the outputs (the handlers are restored on exit), and pass it
    to the trainer's callbacks (it re-installs its handlers in ``on_train_start``, over Lightning's SIGTERM handler,
    whose broadcast from inside the handler would hang the ranks that did not get the signal).

    Args:
        ckpt_dir: where ``last.ckpt`` goes (the ``ModelCheckpoint`` dirpath, so a later save_last overwrites it).
        signals: the signals that stop the run (default SIGINT, SIGTERM; inside SLURM also USR1/USR2, see
            :mod:`grpolab.app.slurm`).
    """

    def __init__(self, ckpt_dir: str | Path, signals: tuple[int, ...] = SIGNALS) -> None:
        super().__init__()
        self.ckpt_dir = Path(ckpt_dir)
        self.signals = tuple(signals)
        self.signum: int | None = None  # the signal this process received (or request_stop's)
        self.phase = "training"  # what run_training is doing: "start validation", "training", "final validation", ...
        self.stopped_in: str | None = None  # the phase a stop was first seen in (summary.json "stopped_in")
        self.ckpt_path: Path | None = None  # last.ckpt, once a stop saved it
        self._previous: dict[int, Any] = {}
        self._trainer: L.Trainer | None = None

    def request_stop(self, signum: int) -> None:
        """Ask for the stop a first signal asks for (checked at the next step or validation batch boundary), from
        any code in this process, e.g. a SLURM requeue hook. Idempotent: an earlier request keeps its signal."""
        if self.signum is None:
            self.signum = signum
            self.stopped_in = self.phase

    def attach(self, trainer: L.Trainer) -> None:
        """Keep our SIGINT/SIGTERM handlers over Lightning's: Lightning registers its own at the start of every
        ``fit``/``validate`` (a SIGTERM notifier that broadcasts from inside the handler under DDP, and loops that
        then exit with status 0); this re-installs ours right after that registration, for every signal of
        ``signals`` (inside a SLURM job also USR1/USR2, so our step-boundary save and requeue replace Lightning's
        mid-step auto-requeue: :mod:`grpolab.app.slurm`). ``on_train_start``/``on_validation_start`` re-install too, in case
        a Lightning version has no such registration method."""
        self._trainer = trainer
        connector = getattr(trainer, "_signal_connector", None)
        register = getattr(connector, "register_signal_handlers", None)
        if register is None:
            return

        def register_then_ours() -> None:
            register()
            self._install()

        connector.register_signal_handlers = register_then_ours

    # ------------------------------------------------------------------ handlers
    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in self.signals}
            self._install()
        if (pending := pending_signal()) is not None:  # a joblib worker signalled while it built this job
            log.warning("%s arrived while the job was starting: it stops at its first boundary",
                        signal.Signals(pending).name)
            self.request_stop(pending)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _install(self) -> None:
        if self._previous and threading.current_thread() is threading.main_thread():
            for s in self.signals:
                signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # the second signal: abort now, as if nothing handled it
            log.warning("%s again: aborting now, without saving", name)
            self._kill_launched_ranks()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.request_stop(signum)
        if self.phase == "training":
            log.warning("%s received: stopping after the current training step and saving %s (send it again to "
                        "abort now)", name, self.ckpt_dir / "last.ckpt")
        else:
            log.warning("%s received (%s): stopping at the next batch and writing summary.json and policy/ (send "
                        "it again to abort now)", name, self.phase)

    def _kill_launched_ranks(self) -> None:
        from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        if isinstance(launcher, _SubprocessScriptLauncher):
            launcher.kill(signal.SIGKILL)

    # ------------------------------------------------------------------ Lightning hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer = trainer
        self._install()  # Lightning's signal connector replaced our SIGTERM handler when fit started

    def agreed_signum(self, trainer: L.Trainer) -> int:
        """The signal any rank received (0 = none): a max over the ranks under DDP/FSDP, this process's flag
        otherwise. Every rank must call it at the same point (it is a collective with several processes). Before
        the process group exists (before the first ``fit``/``validate``, where Lightning's launcher starts the other
        ranks) it is this process's flag."""
        if trainer.world_size <= 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.signum or 0
        flag = torch.tensor([self.signum or 0], device=trainer.strategy.root_device)
        return int(trainer.strategy.reduce(flag, reduce_op="max").item())

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer = trainer
        self._install()
        if trainer.state.fn != TrainerFn.FITTING and not trainer.sanity_checking:
            log.info("%s at step %d", self.phase, trainer.global_step)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        """Outside ``fit`` (``trainer.validate``): stop after this batch once any rank got a signal (every rank
        validates the same batches, so the reduction is reached by all). Inside ``fit`` the validation runs to its
        end and the stop comes at the next step boundary, where the checkpoint is consistent."""
        if trainer.state.fn == TrainerFn.FITTING:
            return
        signum = self.agreed_signum(trainer)
        if signum:
            self.request_stop(signum)
            raise TrainingInterrupted(signum, trainer.global_step, None)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        signum = self.agreed_signum(trainer)
        if not signum:
            return
        self.request_stop(signum)  # a rank that did not get the signal stops with the same one
        path = self.ckpt_dir / "last.ckpt"
        trainer.save_checkpoint(path)  # every rank takes part (sharded strategies), rank 0 writes
        self.ckpt_path = path
        log.warning("%s: stopped at step %d; saved %s", signal.Signals(signum).name, trainer.global_step, path)
        raise TrainingInterrupted(signum, trainer.global_step, path)
