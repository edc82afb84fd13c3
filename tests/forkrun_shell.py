"""A real shell whose ``python src/train.py`` and ``python src/eval.py`` fork from the tests' fork server
(:mod:`forkrun`), for the tests that run a page's shell blocks as written (the README's Quickstart, the own-data guide).

:func:`shell_env` returns an environment whose ``PATH`` starts with a folder holding ``python``: a two-line shell
script that runs this file's :func:`client` with the real interpreter. The client sends the request (arguments,
working folder, environment) with its own stdin, stdout and stderr (``SCM_RIGHTS``) to the server's socket; the
server forks the run onto those descriptors, so its output goes where the shell sent the client's, and the client
forwards SIGINT, SIGTERM and SIGHUP to the run, then exits with the run's status (or dies by its signal). Anything the
server would not fork (another script or ``-m``, another ``grpolab`` on ``PYTHONPATH``, another import-time
environment, no server or no socket, a closed standard descriptor, ``GRPOLAB_TEST_FORK=0``) the client hands to the
real interpreter with ``exec``: the same process, so the shell sees no difference. Everything the shell does itself
(quoting, ``$(...)``, ``set -euo pipefail``) stays real; what a forked run does not repeat is in :mod:`forkrun`'s
docstring. Besides that, a forked run is not the process the shell started (``$!`` is the client): its parent,
process group and session are the server's, so a signal to the shell's process group reaches it only through the
client, which forwards SIGINT, SIGTERM and SIGHUP to the run alone (not to processes the run starts), and no other
signal (SIGUSR1, SIGQUIT, SIGSTOP, SIGKILL stop the client only); a signal the shell's process ignored (``&``: SIGINT)
the run starts ignoring too, as a real one does until it installs a handler. Its umask, limits, CPU affinity
(``taskset``), niceness and stdout buffering are the server's; the server reaps it, so the shell's ``time`` and its
resource usage do not count its CPU. Only the name ``python`` is replaced: ``python3`` or an interpreter's full path
runs for real. A block that relies on any of these needs a real interpreter (``GRPOLAB_TEST_FORK=0``, or a test of
its own).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sys
from pathlib import Path

import forkrun

SOCKET_VAR = "GRPOLAB_FORKRUN_SOCKET"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def shell_env(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` with ``python`` (a script written into ``folder``) first on ``PATH`` and the socket of the fork server
    for ``env`` in :data:`SOCKET_VAR`; ``env`` itself when ``GRPOLAB_TEST_FORK=0`` (every ``python`` real)."""
    if env.get("GRPOLAB_TEST_FORK", "1") == "0":
        return env
    server = forkrun._server(env)  # noqa: SLF001 - started (or reused) for this environment
    if server.socket is None:  # the server could not make one: every python real
        return env
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "python"
    script = shlex.quote(str(Path(__file__).with_name("forkrun.py")))
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {script} --client "$@"\n')
    shim.chmod(0o755)
    return {**env, "PATH": os.pathsep.join(p for p in (str(folder), env.get("PATH")) if p), SOCKET_VAR: server.socket}


def _real(argv: list[str], mask=None) -> None:
    """``exec`` the real interpreter (with the signal mask ``mask``, when given)."""
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.execv(sys.executable, [sys.executable, *argv])


def client(argv: list[str]) -> None:
    """Run ``python *argv`` forked from the server at ``$GRPOLAB_FORKRUN_SOCKET``, else ``exec`` the interpreter.
    Never returns: exits with the run's status, or by its signal."""
    env = dict(os.environ)
    path = env.pop(SOCKET_VAR, "")
    if not (path and forkrun._forkable([sys.executable, *argv], None, env, None, None)):  # noqa: SLF001
        _real(argv)
    ignored = [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]  # a `&` job: SIGINT
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # held until the run's pid is known: none is lost
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(path)
        request = {"argv": argv, "cwd": os.getcwd(), "env": {**env, SOCKET_VAR: path}, "ignored": ignored}
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
        answer = json.loads(sock.recv(1 << 16) or b"{}")
    except (OSError, ValueError):  # no server there any more, a closed standard descriptor, a garbled answer
        _real(argv, mask)
    if "refused" in answer:
        _real(argv, mask)
    if "pid" not in answer:
        print("forkrun: the fork server did not answer", file=sys.stderr)
        os._exit(1)
    pid = answer["pid"]

    def forward(signum: int, _frame) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # it has just ended: its status is on the way

    for sig in FORWARDED:  # even one the shell's process ignored: the run decides (it ignores it until it handles it)
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one held meanwhile is delivered now, to the run
    try:
        status = json.loads(sock.recv(1 << 16) or b"{}").get("status")  # a forwarded signal does not cut the wait
    except OSError:
        status = None
    if status is None:
        print("forkrun: the fork server went away before the run ended", file=sys.stderr)
        os._exit(1)
    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status & 0xFF)
