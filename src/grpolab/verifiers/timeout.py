"""Time limits for reward calls that work off the main thread and inside worker processes.

math-verify's own timeout uses ``signal.alarm``, which only works in the main thread of the main
interpreter (and not at all inside a C call). Reward scoring runs in data-loader workers, in Lightning
callbacks and in threads, so we never rely on signals. Two mechanisms, with different costs:

**Worker processes** (:class:`ProcessPool`, ``num_workers >= 1``). Persistent Python subprocesses, started
with :mod:`subprocess` (fork + exec of a fresh interpreter, so they also start from daemonic processes
such as DataLoader workers, where :mod:`multiprocessing` refuses to create children, and never inherit
a forked copy of CUDA or Lightning state). Items are sent in chunks over pipes; each worker reports each
result as it finishes it, and an item that takes longer than ``timeout_s`` since the worker's previous
report is cut: the worker is killed (SIGKILL) and replaced, and the rest of its chunk goes back to the
queue. This cuts *every* kind of hang, including a single C call that holds the GIL (a huge integer
power in sympy). Costs: about 2 s of start-up per worker (importing sympy and math-verify), paid once and
again after each kill; about 0.1 ms of pickling and pipe traffic per item; one process per worker.

**A watchdog thread** (:func:`run_in_thread`, ``num_workers == 0``). The items run one after another in a
helper thread while the calling thread waits for each result with a time limit. When the limit passes,
the item is counted as timed out, an exception is raised *inside* the helper thread
(``PyThreadState_SetAsyncExc``) so it stops at the interpreter's next check (a call, a loop's jump back), and
again every 0.25 s until it has stopped (code that swallows exceptions, such as a bare ``except:`` around a call,
can lose one), and the remaining items go to a fresh thread. Cost: one thread start per batch (about 0.1 ms) and a queue hand-off per item. Limit: a
hang inside one C call that holds the GIL cannot be interrupted in-process, and it also blocks the
waiting thread until the call returns; :class:`~grpolab.verifiers.math.MathVerifier` refuses the known
inputs of that kind (power towers, huge factorials) before sympy sees them. Use worker processes when a
hard guarantee is needed.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

OK, ERROR, TIMEOUT, CRASHED = "ok", "error", "timeout", "crashed"
BATCH_TIMEOUT = "batch_timeout"  # not scored because the whole batch ran out of time


@dataclass(frozen=True)
class CallResult:
    """The outcome of one call.

    Attributes:
        status: ``"ok"`` (``value`` holds the return value), ``"error"`` (the call raised; ``value`` holds
            the formatted traceback), ``"timeout"`` (cut after the per-call time limit), ``"batch_timeout"``
            (cut or never started because the batch's time limit ran out) or ``"crashed"`` (its worker
            process died, e.g. killed for memory; ``value`` holds the exit code).
        value: see ``status``.
    """

    status: str
    value: Any = None


# An item is (function name, positional args, keyword args); functions are looked up by name.
Item = tuple[str, tuple, dict]


def _call(funcs: dict[str, Callable], item: Item) -> CallResult:
    name, args, kwargs = item
    try:
        return CallResult(OK, funcs[name](*args, **kwargs))
    except Exception:
        return CallResult(ERROR, traceback.format_exc())


# ----------------------------------------------------------------------------------- thread watchdog
class _Abandoned(BaseException):
    """Raised inside an abandoned scoring thread. A BaseException, so ``except Exception`` in a verifier
    (or in sympy) does not swallow it."""


# Bound once: looking the function up on ``ctypes.pythonapi`` runs Python code, and the thread's stop below must
# not. Called without argtypes, ``None`` is passed as NULL, which clears the thread's pending exception.
_SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc
RAISE_AGAIN_S = 0.25  # how often an abandoned scoring thread is interrupted again until it has stopped


class _ScoringThread(threading.Thread):
    """The watchdog's helper thread: calls ``items[first:]`` in order and puts ``(index, CallResult)`` on
    :attr:`out`, until it runs out of items or is abandoned.

    :meth:`interrupt` raises :class:`_Abandoned` inside it (``PyThreadState_SetAsyncExc``). One such raise can
    be lost: it lands at the thread's next bytecode, and where that bytecode runs under a bare ``except:`` (mpmath
    has several around calls) or inside code whose errors C discards (a finalizer, ``PyObject_HasAttr``), the
    code goes on; a cut sympy comparison then ran to its end, seconds of CPU. So an abandoned thread is
    interrupted again every :data:`RAISE_AGAIN_S` until it has stopped (see :func:`_keep_interrupting`).

    None of those raises escapes the thread: each is issued holding :attr:`_lock`, only between the start of
    :meth:`run`'s ``try`` (``_entered``) and its stop (``_stopped``), and the stop, under the same lock, sets
    ``_stopped`` and then clears any raise still pending with a C call before the interpreter checks for one again.
    That last step rests on CPython's check points (calls, backward jumps, function entry: none between the two), not
    on a language rule; ``tests/verifiers/test_timeouts.py`` hammers it.
    """

    def __init__(self, funcs: dict[str, Callable], items: Sequence[Item], first: int) -> None:
        super().__init__(name="grpolab-reward", daemon=True)
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.num_interrupts = 0
        self._funcs, self._items, self._first = funcs, items, first
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._entered = self._stopped = False
        self._ident_c = ctypes.c_ulong(0)

    def run(self) -> None:
        try:
            self._ident_c = ctypes.c_ulong(threading.get_ident())
            self._entered = True  # from here on an interrupt lands inside this try
            for i in range(self._first, len(self._items)):
                if self._cancelled.is_set():
                    break
                self.out.put((i, _call(self._funcs, self._items[i])))
        except _Abandoned:
            pass
        while True:  # stop: no interrupt is issued after this, and none issued before it is left pending
            try:
                with self._lock:
                    self._stopped = True
                    _SET_ASYNC_EXC(self._ident_c, None)
                return
            except _Abandoned:  # taken before the clear on an interpreter that checks there
                pass

    def interrupt(self) -> bool:
        """Cancel the remaining items and raise :class:`_Abandoned` inside the thread if it is running them.

        Returns:
            ``False`` once the thread has stopped (nothing more to interrupt), else ``True``.
        """
        self._cancelled.set()
        with self._lock:
            if self._stopped or not self.is_alive():
                return False
            if self._entered:  # before that, the cancelled flag stops it before its first item
                _SET_ASYNC_EXC(self._ident_c, ctypes.py_object(_Abandoned))
                self.num_interrupts += 1
            return True


_abandoned: set[_ScoringThread] = set()
_abandoned_changed = threading.Condition()
_interrupter: threading.Thread | None = None


def _keep_interrupting() -> None:
    """Body of the daemon thread that interrupts every abandoned scoring thread again, every
    :data:`RAISE_AGAIN_S`, until each has stopped; it sleeps while there is none."""
    while True:
        with _abandoned_changed:
            while not _abandoned:
                _abandoned_changed.wait()
            threads = list(_abandoned)
        time.sleep(RAISE_AGAIN_S)
        stopped = {t for t in threads if not t.interrupt()}
        with _abandoned_changed:
            _abandoned.difference_update(stopped)
        for t in stopped:
            if t.num_interrupts > 1:
                log.info("an abandoned reward call stopped after %d interrupts", t.num_interrupts)


def _abandon(thread: _ScoringThread) -> None:
    """Interrupt ``thread`` now, and again until it has stopped."""
    global _interrupter
    if not thread.interrupt():
        return
    with _abandoned_changed:
        _abandoned.add(thread)
        if _interrupter is None or not _interrupter.is_alive():
            _interrupter = threading.Thread(
                target=_keep_interrupting, name="grpolab-reward-interrupter", daemon=True
            )
            _interrupter.start()
        _abandoned_changed.notify()


def _forget_abandoned_in_child() -> None:
    """A forked child has none of its parent's threads: start with no abandoned thread and fresh locks."""
    global _abandoned_changed, _interrupter
    _abandoned.clear()
    _abandoned_changed, _interrupter = threading.Condition(), None


os.register_at_fork(after_in_child=_forget_abandoned_in_child)


def run_in_thread(
    funcs: dict[str, Callable],
    items: Sequence[Item],
    timeout_s: float | None,
    batch_timeout_s: float | None = None,
) -> list[CallResult]:
    """Run ``items`` in order in a helper thread, cutting any item that runs over ``timeout_s``, and
    everything still running or waiting when ``batch_timeout_s`` has passed since the call began.

    Safe to call from any thread and from worker processes (no signals). A cut thread is interrupted again
    every :data:`RAISE_AGAIN_S` until it stops (a single interrupt can be swallowed). See the module docstring
    for what cannot be interrupted this way.

    Args:
        funcs: the functions, by name.
        items: ``(name, args, kwargs)`` tuples.
        timeout_s: time limit per item, in seconds (> 0), or ``None`` for none.
        batch_timeout_s: time limit for all of ``items`` together, in seconds (> 0), or ``None``.

    Returns:
        One :class:`CallResult` per item, in order; ``"batch_timeout"`` for every item cut or never
        started because the batch limit ran out.

    Raises:
        ValueError: if a limit is not positive, or both are ``None``.
    """
    if timeout_s is None and batch_timeout_s is None:
        raise ValueError("run_in_thread needs timeout_s or batch_timeout_s")
    for name, value in (("timeout_s", timeout_s), ("batch_timeout_s", batch_timeout_s)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    results: list[CallResult | None] = [None] * len(items)
    batch_deadline = math.inf if batch_timeout_s is None else time.monotonic() + batch_timeout_s
    per_call = math.inf if timeout_s is None else timeout_s
    start = 0
    while start < len(items):
        thread = _ScoringThread(funcs, items, start)
        thread.start()
        while start < len(items):
            left = batch_deadline - time.monotonic()
            wait = min(per_call, left)
            try:
                if wait <= 0:
                    raise queue.Empty
                i, res = thread.out.get(timeout=wait)
            except queue.Empty:
                _abandon(thread)
                if per_call < left:
                    log.warning("reward call %d cut after %.1f s (thread watchdog)", start, timeout_s)
                    results[start] = CallResult(TIMEOUT)
                    start += 1
                    break
                _cut_batch(results, batch_timeout_s)
                return results  # type: ignore[return-value]
            results[i] = res
            start = i + 1
    return results  # type: ignore[return-value]


def _cut_batch(results: list[CallResult | None], batch_timeout_s: float | None) -> None:
    """Mark every item without a result as cut by the batch time limit, and say how many."""
    missing = [i for i, r in enumerate(results) if r is None]
    for i in missing:
        results[i] = CallResult(BATCH_TIMEOUT)
    log.warning(
        "reward batch: %d of %d calls not scored within the batch time limit of %.1f s "
        "(verifier.batch_timeout_s); they score None",
        len(missing),
        len(results),
        batch_timeout_s,
    )


# ------------------------------------------------------------------------------------ worker processes
