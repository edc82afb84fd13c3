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
(``PyThreadState_SetAsyncExc``) so it stops at its next Python bytecode, and the remaining items go to a
fresh thread. Cost: one thread start per batch (about 0.1 ms) and a queue hand-off per item. Limit: a
hang inside one C call that holds the GIL cannot be interrupted in-process, and it also blocks the
waiting thread until the call returns; :class:`~grpolab.verifiers.math.MathVerifier` refuses the known
inputs of that kind (power towers, huge factorials) before sympy sees them. Use worker processes when a
hard guarantee is needed.
"""

from __future__ import annotations

import ctypes
import logging
import math
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


def _raise_in_thread(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))


def run_in_thread(
    funcs: dict[str, Callable],
    items: Sequence[Item],
    timeout_s: float | None,
    batch_timeout_s: float | None = None,
) -> list[CallResult]:
    """Run ``items`` in order in a helper thread, cutting any item that runs over ``timeout_s``, and
    everything still running or waiting when ``batch_timeout_s`` has passed since the call began.

    Safe to call from any thread and from worker processes (no signals). See the module docstring for
    what cannot be interrupted this way.

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
        out: queue.SimpleQueue = queue.SimpleQueue()
        cancelled = threading.Event()

        def work(first: int, out: queue.SimpleQueue = out, cancelled: threading.Event = cancelled) -> None:
            try:
                for i in range(first, len(items)):
                    if cancelled.is_set():
                        return
                    out.put((i, _call(funcs, items[i])))
            except _Abandoned:
                return

        thread = threading.Thread(target=work, args=(start,), name="grpolab-reward", daemon=True)
        thread.start()
        while start < len(items):
            left = batch_deadline - time.monotonic()
            wait = min(per_call, left)
            try:
                if wait <= 0:
                    raise queue.Empty
                i, res = out.get(timeout=wait)
            except queue.Empty:
                cancelled.set()
                _raise_in_thread(thread, _Abandoned)
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
