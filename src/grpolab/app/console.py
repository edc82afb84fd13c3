"""Console output that cannot stop a run: a closed stdout/stderr (``| tee log`` killed by the same Ctrl-C,
``| head -n 5``, a dropped ssh session's pty) makes every later write a no-op instead of a ``BrokenPipeError``.

Python ignores SIGPIPE, so a write to a pipe without a reader raises ``BrokenPipeError`` (``EPIPE``); a progress
bar's redraw or a ``print`` then ended the run with status 1 before its checkpoint and summary were written, and the
interpreter's last flush of ``sys.stdout`` made the exit status 120. :func:`guard_console` wraps ``sys.stdout`` and
``sys.stderr`` before anything captures them (Hydra's console log handler, tqdm bars): the first write or flush that
fails with ``EPIPE``/``EIO``/``EBADF``... (any ``OSError``) points the file descriptor at ``/dev/null`` and drops
what was pending; the run goes on, and ``train.log`` (Hydra's file handler) still gets every log line.

Light on purpose (standard library only): the entry points call it first.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class GuardedStream:
    """A text stream proxy: writes and flushes go to ``stream`` until one fails with an ``OSError``; from then on
    the stream's file descriptor is ``/dev/null`` and writes are dropped (reported as written).

    Everything else (``fileno``, ``isatty``, ``encoding``, ...) is the wrapped stream's.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False  # True once a write failed: the reader went away

    def _lost(self) -> None:
        self.closed_by_reader = True
        try:  # C-level writers and other references to the same descriptor stop failing too
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        try:
            self._stream.flush()  # now into /dev/null: nothing pending is left to fail at exit
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._stream.write(text)
            except OSError:
                self._lost()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except OSError:
                self._lost()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_console() -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` by :class:`GuardedStream` proxies (once; idempotent). Call it before
    logging is configured, so that the console handlers write through the proxies."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream))
