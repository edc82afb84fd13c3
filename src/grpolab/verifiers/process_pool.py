"""Persistent worker processes for reward calls with a hard time limit (:class:`ProcessPool`).

The workers are started with :mod:`subprocess` (a fresh interpreter) and fed chunks of items over pipes; an
item that runs past its limit gets its worker killed and replaced. See :mod:`grpolab.verifiers.timeout` for
when to use them instead of the watchdog thread.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from grpolab.verifiers.timeout import CRASHED, TIMEOUT, CallResult, Item, _call, _cut_batch
from grpolab.verifiers.worker_lifetime import die_with_parent as _die_with_parent

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<Q")  # the byte length of each pickled frame on a pipe


def _write_frame(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


class _FrameReader:
    """Length-prefixed pickle frames from a pipe, readable with a deadline via :func:`select.poll`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.eof = False

    def pop(self) -> Any | None:
        """A complete buffered frame, or ``None``."""
        if len(self.buf) < _HEADER.size:
            return None
        (n,) = _HEADER.unpack_from(self.buf)
        if len(self.buf) < _HEADER.size + n:
            return None
        data = bytes(self.buf[_HEADER.size : _HEADER.size + n])
        del self.buf[: _HEADER.size + n]
        return pickle.loads(data)

    def fill(self) -> None:
        """Read what the pipe has (call only when poll says readable, or to block)."""
        chunk = os.read(self.fd, 1 << 20)
        if chunk:
            self.buf += chunk
        else:
            self.eof = True

    def recv_blocking(self) -> Any:
        """The next frame, blocking. Raises EOFError at end of stream."""
        while True:
            obj = self.pop()
            if obj is not None:
                return obj
            if self.eof:
                raise EOFError
            self.fill()


def _worker_main(parent: int | None = None) -> None:
    """Entry point of a worker process (run as an import, so pickled classes keep their module name).

    Args:
        parent: the training process's pid; the worker goes when it dies (:func:`_die_with_parent`).
    """
    if parent is not None:
        _die_with_parent(parent)
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints from libraries must not corrupt the protocol pipe
    reader = _FrameReader(0)
    init = reader.recv_blocking()
    sys.path[:] = init["sys_path"]
    funcs = pickle.loads(init["funcs"])
    _write_frame(out_fd, ("ready", os.getpid()))
    while True:
        try:
            msg = reader.recv_blocking()
        except EOFError:
            return
        if msg[0] == "close":
            return
        for index, item in msg[1]:
            _write_frame(out_fd, ("result", index, _call(funcs, item)))


class _Spawner:
    """One daemon thread per process that starts every worker: Linux's parent-death signal fires when the thread
    that forked a child exits, and pools are often first used from short-lived threads (a background rollout job)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="grpolab-reward-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                box.append(fn())
            except BaseException as err:  # handed to the caller
                box.append(err)
            done.set()

    def run(self, fn: Callable[[], Any]) -> Any:
        box: list = []
        done = threading.Event()
        self.jobs.put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawn(fn: Callable[[], Any]) -> Any:
    """``fn()`` (a ``Popen``) in the main thread, or else in this process's long-lived spawner thread."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid():  # a forked child (DataLoader worker) needs its own
            _spawner = _Spawner()
    return _spawner.run(fn)


class _Worker:
    def __init__(self, payload: dict) -> None:
        code = f"from grpolab.verifiers.process_pool import _worker_main; _worker_main({os.getpid()})"
        self.proc = _spawn(lambda: subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            close_fds=True,
            start_new_session=True,  # a terminal's Ctrl-C to the trainer's group is the trainer's to handle
        ))
        self.wfd = self.proc.stdin.fileno()
        self.reader = _FrameReader(self.proc.stdout.fileno())
        self.state = "starting"
        self.since = time.monotonic()
        self.outstanding: collections.deque[int] = collections.deque()
        _write_frame(self.wfd, payload)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        try:
            _write_frame(self.wfd, ("close",))
            self.proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        w.close()
    workers.clear()


class ProcessPool:
    """Persistent worker processes that run named functions with a per-call time limit.

    Args:
        funcs: the functions, by name; they must be picklable (module-level classes or functions),
            and importable in a fresh interpreter with the caller's ``sys.path``.
        num_workers: number of worker processes (>= 1).
        timeout_s: per-call time limit in seconds, or ``None`` for no limit.
        start_timeout_s: how long a worker may take to start (imports) before it is an error.

    Raises:
        ValueError: if ``num_workers < 1`` or ``timeout_s <= 0``.
        TypeError: if ``funcs`` cannot be pickled.
    """

    def __init__(
        self,
        funcs: dict[str, Callable],
        num_workers: int,
        timeout_s: float | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        try:
            blob = pickle.dumps(funcs, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(
                f"worker processes need picklable reward functions (module-level classes/functions): {e}"
            ) from e
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._payload = {"sys_path": list(sys.path), "funcs": blob}
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        self.num_restarts = 0

    def close(self) -> None:
        """Stop the workers (they restart on the next :meth:`run`)."""
        with self._lock:
            _shutdown(self._workers)

    def _replace(self, w: _Worker) -> None:
        self._workers[self._workers.index(w)] = _Worker(self._payload)
        self.num_restarts += 1

    def run(self, items: Sequence[Item], batch_timeout_s: float | None = None) -> list[CallResult]:
        """Run ``items`` on the workers; a call over the time limit gets ``CallResult("timeout")``.

        Args:
            items: ``(name, args, kwargs)`` tuples; args and kwargs must be picklable.
            batch_timeout_s: time limit for all of ``items`` together (worker start-up included), or
                ``None``. When it runs out, busy workers are killed and replaced, and every item without a
                result gets ``CallResult("batch_timeout")``.

        Returns:
            One :class:`CallResult` per item, in order.

        Raises:
            RuntimeError: if a worker dies or hangs while starting (e.g. the functions cannot be imported
                in a fresh interpreter).
        """
        if batch_timeout_s is not None and batch_timeout_s <= 0:
            raise ValueError(f"batch_timeout_s must be > 0 or None, got {batch_timeout_s}")
        with self._lock:
            return self._run(items, batch_timeout_s)

    def _run(self, items: Sequence[Item], batch_timeout_s: float | None = None) -> list[CallResult]:
        n = len(items)
        if n == 0:
            return []
        batch_deadline = math.inf if batch_timeout_s is None else time.monotonic() + batch_timeout_s
        results: list[CallResult | None] = [None] * n
        pending = collections.deque(range(n))
        chunk = max(1, min(32, n // (self.num_workers * 4)))
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._payload))
        done = 0
        while done < n:
            now = time.monotonic()
            for w in self._workers:
                if w.state == "idle" and pending:
                    take = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                    w.outstanding.extend(take)
                    w.state, w.since = "busy", now
                    try:
                        _write_frame(w.wfd, ("items", [(i, items[i]) for i in take]))
                    except OSError:  # the worker died between calls; its items are requeued below
                        w.reader.eof = True
            if time.monotonic() >= batch_deadline:
                for w in list(self._workers):
                    if w.state == "busy":  # mid-item: only a kill stops it
                        w.kill()
                        w.outstanding.clear()
                        self._replace(w)
                _cut_batch(results, batch_timeout_s)
                return results  # type: ignore[return-value]
            active = [w for w in self._workers if w.state != "idle"]
            deadline = min(min(self._deadline(w) for w in active), batch_deadline)
            # Complete frames are always popped right after a read, so waiting on the pipes is enough.
            # poll, not select: select fails on descriptors >= 1024, common in a busy training process.
            wait = None if deadline == float("inf") else max(0.0, deadline - time.monotonic()) * 1000
            fds = {w.reader.fd: w for w in active}
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            readable = [fd for fd, _ in poller.poll(wait)]
            for fd in readable:
                fds[fd].reader.fill()
            for w in (fds[fd] for fd in readable):
                while (msg := w.reader.pop()) is not None:
                    w.since = time.monotonic()
                    if msg[0] == "ready":
                        w.state = "idle"
                    else:
                        _, i, res = msg
                        w.outstanding.popleft()
                        results[i] = res
                        done += 1
                        if not w.outstanding:
                            w.state = "idle"
            now = time.monotonic()
            for w in list(self._workers):
                if w.reader.eof:
                    done += self._lost(w, results, pending, CRASHED)
                elif w.state != "idle" and now > self._deadline(w):
                    done += self._lost(w, results, pending, TIMEOUT)
        return results  # type: ignore[return-value]

    def _deadline(self, w: _Worker) -> float:
        if w.state == "starting":
            return w.since + self.start_timeout_s
        return w.since + self.timeout_s if self.timeout_s is not None else float("inf")

    def _lost(self, w: _Worker, results: list, pending: collections.deque, why: str) -> int:
        """Handle a worker that died or ran over: count its current item, requeue the rest, replace it."""
        if w.state == "starting":
            w.kill()
            _shutdown(self._workers)  # start clean next time
            raise RuntimeError(
                f"reward worker process {'exited' if why == CRASHED else 'hung'} while starting "
                f"(exit code {w.proc.returncode}); its stderr is above. Reward functions must be importable "
                "in a fresh interpreter."
            )
        w.kill()
        code = w.proc.returncode
        if not w.outstanding:  # died while idle: nothing lost
            log.warning("reward worker %d exited (code %s) between calls; replaced", w.proc.pid, code)
            self._replace(w)
            return 0
        i = w.outstanding.popleft()
        pending.extendleft(reversed(w.outstanding))
        w.outstanding.clear()
        if why == TIMEOUT:
            log.warning(
                "reward call %d cut after %.1f s; worker %d killed and replaced",
                i,
                self.timeout_s,
                w.proc.pid,
            )
            results[i] = CallResult(TIMEOUT)
        else:
            log.warning("reward worker %d died (exit code %s) during call %d; replaced", w.proc.pid, code, i)
            results[i] = CallResult(CRASHED, code)
        self._replace(w)
        return 1
