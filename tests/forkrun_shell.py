"""A real shell whose ``python src/train.py`` and ``python src/eval.py`` fork from the tests' fork server
(:mod:`forkrun`), for the tests that run a page's shell blocks as written (the README's Quickstart, the own-data guide).

:func:`shell_env` returns an environment whose ``PATH`` starts with a folder holding ``python``: a two-line shell
script that runs this file's :func:`client` with the real interpreter. The client sends the request (arguments,
working folder, environment) with its own stdin, stdout and stderr (``SCM_RIGHTS``) to the server's socket; the
server forks the run onto those descriptors, so its output goes where the shell sent the client's, and the client
forwards SIGINT, SIGTERM and SIGHUP to the run, then exits with the run's status (or dies by its signal). Anything the
server would not fork (another script or ``-m``, another ``grpolab`` on ``PYTHONPATH``, another import-time
environment, ``GRPOLAB_TEST_FORK=0``) the client hands to the real interpreter with ``exec``: the same process, so
the shell sees no difference. Everything the shell does itself (quoting, ``$(...)``, ``set -euo pipefail``) stays
real; what a forked run does not repeat is in :mod:`forkrun`'s docstring.
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


def shell_env(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` with ``python`` (a script written into ``folder``) first on ``PATH`` and the socket of the fork server
    for ``env`` in :data:`SOCKET_VAR`; ``env`` itself when ``GRPOLAB_TEST_FORK=0`` (every ``python`` real)."""
    if env.get("GRPOLAB_TEST_FORK", "1") == "0":
        return env
    server = forkrun._server(env)  # noqa: SLF001 - started (or reused) for this environment
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "python"
    script = shlex.quote(str(Path(__file__).with_name("forkrun.py")))
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {script} --client "$@"\n')
    shim.chmod(0o755)
    return {**env, "PATH": f"{folder}{os.pathsep}{env.get('PATH', '')}", SOCKET_VAR: server.socket}


def client(argv: list[str]) -> None:
    """Run ``python *argv`` forked from the server at ``$GRPOLAB_FORKRUN_SOCKET``, else ``exec`` the interpreter.
    Never returns: exits with the run's status, or by its signal."""
    env = dict(os.environ)
    path = env.pop(SOCKET_VAR, "")
    if not (path and forkrun._forkable([sys.executable, *argv], None, env, None, None)):  # noqa: SLF001
        os.execv(sys.executable, [sys.executable, *argv])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    request = {"argv": argv, "cwd": os.getcwd(), "env": {**env, SOCKET_VAR: path}}
    socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
    answer = json.loads(sock.recv(1 << 16) or b"{}")
    if "refused" in answer:
        os.execv(sys.executable, [sys.executable, *argv])
    if "pid" not in answer:
        print("forkrun: the fork server did not answer", file=sys.stderr)
        os._exit(1)
    pid = answer["pid"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    status = json.loads(sock.recv(1 << 16) or b"{}").get("status")  # a forwarded signal does not cut the wait
    if status is None:
        print("forkrun: the fork server went away before the run ended", file=sys.stderr)
        os._exit(1)
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status & 0xFF)
