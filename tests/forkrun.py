"""``subprocess.run`` and ``subprocess.Popen`` for ``python src/train.py`` and ``python src/eval.py``, forked from a
process that has already imported the training stack.

Every ``src/train.py`` process spends about 7 CPU s importing torch, Lightning (which imports ``torch._dynamo`` and
torchmetrics, which imports ``scipy.signal``) and transformers before its first step, far more than a tiny test run
trains. :func:`run` and :func:`Popen` take the arguments of their :mod:`subprocess` namesakes and, for a run of one
of the two entry points of this checkout, ask a *fork server* (this file run as a script: one per xdist worker and
import-time environment, started on first use) to fork a child that opens the requested outputs, becomes a session
leader if asked (``start_new_session``), takes the request's working folder, environment and arguments, runs the
script as ``__main__`` (:func:`runpy.run_path`) and exits as the interpreter would (non-daemon threads joined,
``atexit`` handlers run, streams flushed; an uncaught KeyboardInterrupt dies by SIGINT). The server imports and
does nothing else: one Python thread (torch's import also leaves two idle OpenBLAS pool threads, which a fork does not
copy; OpenBLAS starts them again in the child when needed), no tensor, no logging set-up, the interpreter's own signal
handlers, so a child starts from the state a fresh interpreter reaches after the same imports, and a signal sent to
its pid reaches it as it would that one (a shell's forked run is another case: :mod:`forkrun_shell`). In ``ps`` a
child shows the server's command line (``python tests/forkrun.py``), not its own.

What a child does not share with a fresh ``python src/train.py``: warnings and prints of the imports themselves (they
went to the server's stderr once), and environment variables read at import time. So a request whose import-time
environment (:data:`IMPORT_TIME_VARS`) differs from the server's gets a server of its own, and these run as real
processes (:mod:`subprocess` itself): any other command, a script outside this checkout's ``src/``, an argument not
listed in the docstrings below, and everything when ``GRPOLAB_TEST_FORK=0`` is set. Tests whose subject is the
interpreter itself (the console output and import-time warnings, the exit collection, a closed stdout, a SLURM job, a
DDP rank Lightning starts) call :mod:`subprocess` directly; a real shell running a page's blocks gets a ``python`` that
forks through the server's socket (:mod:`forkrun_shell`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {REPO_ROOT / "src" / "train.py", REPO_ROOT / "src" / "eval.py"}
IMPORT_TIME_VARS = ("HF_", "TRANSFORMERS_", "HUGGINGFACE_", "TORCH", "PYTORCH_", "ATEN_", "ONEDNN_", "DNNL_", "MKL_",
                    "OMP_", "KMP_", "PYTHON", "LD_", "MALLOC_", "GLIBC_", "CUDA_", "TOKENIZERS_", "SCIPY_", "MPL")
PRELOAD = ("torch", "lightning.pytorch", "transformers", "hydra", "omegaconf", "grpolab.app.cli",
           "grpolab.app.console", "grpolab.app.sweep_jobs", "grpolab.app.plan_from_config", "grpolab.app.run")


def _import_time_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables a server's imports read; ``PYTHONPATH`` is not one: a child puts its entries on ``sys.path``
    itself, where the interpreter would (after the script's folder), and none of them holds a module the server
    imported."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_VARS) and k != "PYTHONPATH"))


class _Server:
    """One fork server: a child process of this one; requests on its stdin, replies on its stdout (JSON lines), read
    by a thread here: ``{"id": n, "pid": pid}`` once a request's child is forked, ``{"pid": pid, "status": code}``
    when it has exited."""

    def __init__(self, env: dict[str, str]) -> None:
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        self._tmp = tempfile.TemporaryDirectory(prefix="forkrun-server-")
        self.socket = os.path.join(self._tmp.name, "socket")  # where a shell's `python` asks (forkrun_shell.py)
        self.proc = subprocess.Popen([sys.executable, __file__, self.socket], cwd=REPO_ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        ready = json.loads(self.proc.stdout.readline() or "{}")
        if not ready.get("ready"):
            raise RuntimeError(f"the fork server did not start ({self.proc.poll()})")
        if not ready.get("socket"):  # no UNIX socket here: a shell's python runs the real interpreter
            self.socket = None
        self.changed = threading.Condition()
        self.pids: dict[int, int] = {}
        self.status: dict[int, int] = {}
        self.next_id, self.gone = 0, False
        threading.Thread(target=self._read_replies, name="forkrun-replies", daemon=True).start()

    def _read_replies(self) -> None:
        for line in self.proc.stdout:
            reply = json.loads(line)
            with self.changed:
                if "id" in reply:
                    self.pids[reply["id"]] = reply["pid"]
                    self.status.pop(reply["pid"], None)  # a reused pid: an earlier child's status is not this one's
                else:
                    self.status[reply["pid"]] = reply["status"]
                self.changed.notify_all()
        with self.changed:  # the server is gone: nothing more will come
            self.gone = True
            self.changed.notify_all()

    def start(self, request: dict) -> int:
        """Send ``request``; return the forked child's pid."""
        with self.changed:
            rid = self.next_id = self.next_id + 1
            self.proc.stdin.write(json.dumps({**request, "id": rid}) + "\n")
            self.proc.stdin.flush()
            self.changed.wait_for(lambda: rid in self.pids or self.gone)
            if rid not in self.pids:
                raise RuntimeError(f"the fork server exited ({self.proc.poll()})")
            return self.pids.pop(rid)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit status (negative: killed by that signal), or None if it runs past ``timeout``."""
        with self.changed:
            if not self.changed.wait_for(lambda: pid in self.status or self.gone, timeout):
                return None
            if pid not in self.status:
                raise RuntimeError(f"the fork server exited ({self.proc.poll()})")
            return self.status[pid]


_servers: dict[tuple, _Server] = {}
_servers_lock = threading.Lock()


def _server(env: dict[str, str]) -> _Server:
    key = _import_time_env(env)
    with _servers_lock:
        if key not in _servers or _servers[key].proc.poll() is not None:
            _servers[key] = _Server(env)
        return _servers[key]


_PIPES = (None, subprocess.PIPE, subprocess.DEVNULL)


def _forkable(cmd, cwd, env, stdout, stderr) -> bool:
    if (not isinstance(cmd, (list, tuple)) or len(cmd) < 2 or cmd[0] != sys.executable or stdout not in _PIPES
            or stderr not in (*_PIPES, subprocess.STDOUT)):
        return False
    env = os.environ if env is None else env
    script = Path(cwd or os.getcwd(), cmd[1]).resolve()
    other_grpolab = any((Path(cwd or os.getcwd(), entry) / "grpolab").resolve() != REPO_ROOT / "src" / "grpolab"
                        and (Path(cwd or os.getcwd(), entry) / "grpolab").exists()
                        for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry)
    return script in SCRIPTS and not other_grpolab and env.get("GRPOLAB_TEST_FORK", "1") != "0"


def _start(cmd, cwd, env: dict[str, str], paths: dict[str, str], session: bool) -> tuple[_Server, int]:
    """Ask the server for ``env`` to fork ``cmd`` with its outputs at ``paths`` (``out``, ``err``); return it and the
    child's pid."""
    server = _server(env)
    return server, server.start({"argv": [str(c) for c in cmd[1:]], "cwd": str(Path(cwd or os.getcwd()).resolve()),
                                 "env": env, "out": paths["out"], "err": paths["err"], "session": session})


def _output_paths(folder: str, stdout, stderr, fifo: bool) -> dict[str, str]:
    """Where a child writes its stdout and stderr: ``os.devnull`` for ``DEVNULL``, stdout's path for ``STDOUT``,
    else a file in ``folder`` (a named pipe when ``PIPE`` and ``fifo``; ``<name>.log`` when inherited)."""
    paths: dict[str, str] = {}
    for name, dest in (("out", stdout), ("err", stderr)):
        if dest == subprocess.DEVNULL:
            paths[name] = os.devnull
        elif dest == subprocess.STDOUT:
            paths[name] = paths["out"]
        else:
            paths[name] = os.path.join(folder, name if dest == subprocess.PIPE else name + ".log")
            if dest == subprocess.PIPE and fifo:
                os.mkfifo(paths[name])
    return paths


class _Reader:
    """A daemon thread reading ``stream`` to its end, then closing it: :attr:`data` once :meth:`join` says it has
    ended (closing a stream another thread reads waits for that read: only this thread closes it)."""

    def __init__(self, stream) -> None:
        self.data, self._stream, self._error = None, stream, None
        self._thread = threading.Thread(target=self._read, name="forkrun-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            self.data = self._stream.read()
        except Exception as e:  # noqa: BLE001 - a decoding error, say: raised by join(), in the caller's thread
            self._error = e
        finally:
            self._stream.close()

    def join(self, deadline: float | None) -> bool:
        """Whether the output has ended by ``deadline`` (``time.monotonic()``; None: wait as long as it takes).

        Raises:
            Exception: what reading the output raised (``UnicodeDecodeError`` in text mode, say).
        """
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()


class ForkedPopen:
    """The part of :class:`subprocess.Popen` the tests use, for a child of a fork server: ``pid``, ``returncode``,
    ``stdout``/``stderr`` (named pipes when ``PIPE``, read as a pipe), ``poll``, ``wait``, ``communicate``,
    ``send_signal``, ``terminate``, ``kill``; a context manager. ``start_new_session=True`` makes the child a session
    (and process group) leader, as :class:`subprocess.Popen` does."""

    def __init__(self, cmd, *, cwd=None, env=None, stdout=None, stderr=None, text: bool = False,
                 start_new_session: bool = False) -> None:
        self.args, self.returncode, self._readers = cmd, None, None
        self._tmp = tempfile.TemporaryDirectory(prefix="forkrun-")
        paths = _output_paths(self._tmp.name, stdout, stderr, fifo=True)
        # an inherited output is a file, shown when the child has ended
        self._shown = [(p, sys.stdout if n == "out" else sys.stderr) for n, p in paths.items() if p.endswith(".log")
                       and not (n == "err" and p == paths["out"])]
        self._server, self.pid = _start(cmd, cwd, dict(os.environ if env is None else env), paths, start_new_session)
        mode = "r" if text else "rb"  # the child opens its outputs first of all, in this order
        self.stdout = open(paths["out"], mode) if stdout == subprocess.PIPE else None  # noqa: SIM115
        self.stderr = open(paths["err"], mode) if stderr == subprocess.PIPE else None  # noqa: SIM115

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (negative: killed by that signal).

        Raises:
            subprocess.TimeoutExpired: the child runs past ``timeout`` seconds (it runs on).
        """
        if (code := self._wait(timeout)) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            status = self._server.wait(self.pid, timeout)
            if status is None:
                return None
            self.returncode = status
            for path, stream in self._shown:
                if os.path.exists(path):
                    stream.write(Path(path).read_text(errors="replace"))
            self._shown = []
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple:
        """Read what is left of the piped outputs to their end, then wait for the child, all within ``timeout``
        seconds, as :meth:`subprocess.Popen.communicate`: the reading goes on in a thread per output, so a call that
        raised can be repeated and loses nothing (a process the child started may hold an output open after the
        child's exit; only the timeout ends that wait).

        Raises:
            subprocess.TimeoutExpired: the outputs did not end, or the child did not exit, within ``timeout``.
        """
        if self._readers is None:
            self._readers = {name: _Reader(stream) for name, stream in (("out", self.stdout), ("err", self.stderr))
                             if stream}
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers.values():
            if not reader.join(deadline):
                raise subprocess.TimeoutExpired(self.args, timeout)
        if self._wait(None if deadline is None else max(0.0, deadline - time.monotonic())) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return tuple(self._readers[n].data if n in self._readers else None for n in ("out", "err"))

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as subprocess.Popen: never a pid the server has already reaped
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ForkedPopen:
        return self

    def __exit__(self, *exc) -> None:
        readers = self._readers or {}
        for name, stream in (("out", self.stdout), ("err", self.stderr)):
            if stream and name not in readers:  # one a reader thread holds it closes itself, at the output's end
                stream.close()
        self.wait()
        self._tmp.cleanup()


def Popen(cmd, **kwargs):  # noqa: N802 - named as the class it stands in for
    """:class:`subprocess.Popen`, forked from a server that has imported the stack when ``cmd`` runs one of this
    checkout's entry points (see the module docstring) and only ``cwd``, ``env``, ``stdout``/``stderr`` (``PIPE``,
    ``DEVNULL``, ``STDOUT``, inherited), ``text`` and ``start_new_session`` are given; else a real process."""
    allowed = {"cwd", "env", "stdout", "stderr", "text", "start_new_session"}
    if set(kwargs) - allowed or not _forkable(cmd, *(kwargs.get(k) for k in ("cwd", "env", "stdout", "stderr"))):
        return subprocess.Popen(cmd, **kwargs)
    return ForkedPopen(cmd, **kwargs)


def run(cmd, *, capture_output: bool = False, text: bool = False, timeout: float | None = None, check: bool = False,
        cwd=None, env=None, stdout=None, stderr=None, **kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run`, forked from a server that has imported the stack when ``cmd`` is
    ``[sys.executable, <this checkout>/src/{train,eval}.py, ...]`` (see the module docstring), else passed on.

    Supports ``capture_output``/``stdout``/``stderr`` (``PIPE``, ``DEVNULL``, ``STDOUT``, inherited), ``text``,
    ``timeout``, ``check``, ``cwd`` and ``env``; anything else goes to a real process.

    Raises:
        subprocess.TimeoutExpired: the run took longer than ``timeout`` (the child is killed).
        subprocess.CalledProcessError: ``check`` and a non-zero exit status.
    """
    if capture_output:
        stdout = stderr = subprocess.PIPE
    if kwargs or not _forkable(cmd, cwd, env, stdout, stderr):
        return subprocess.run(cmd, text=text, timeout=timeout, check=check, cwd=cwd, env=env, stdout=stdout,
                              stderr=stderr, **kwargs)
    with tempfile.TemporaryDirectory(prefix="forkrun-") as tmp:  # files, not pipes: nothing to read while it runs
        paths = _output_paths(tmp, stdout, stderr, fifo=False)
        server, pid = _start(cmd, cwd, dict(os.environ if env is None else env), paths, session=False)
        status = server.wait(pid, timeout)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            server.wait(pid, None)
            raise subprocess.TimeoutExpired(cmd, timeout)
        got = {}
        for name, dest in (("out", stdout), ("err", stderr)):
            path = paths[name]
            if dest in (None, subprocess.PIPE) and os.path.exists(path):
                data = Path(path).read_bytes()
                if dest is None:  # not captured: shown as a run's own output would be
                    (sys.stdout if name == "out" else sys.stderr).write(data.decode(errors="replace"))
                else:
                    got[name] = data.decode() if text else data
    proc = subprocess.CompletedProcess(cmd, status, got.get("out"), got.get("err"))
    if check:
        proc.check_returncode()
    return proc


def spawn(fn, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` with the processes forked from multiprocessing's fork server
    (``start_method="forkserver"``), which imports :data:`PRELOAD`'s torch, Lightning and transformers once per test
    process instead of once per rank. ``fn`` must not rely on environment variables set after the first call (the
    server keeps the environment it started with); the ranks' own set-up (``init_process_group``) is ``fn``'s.

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised (its traceback in the message).
    """
    import multiprocessing

    import torch.multiprocessing as mp

    fork = os.environ.get("GRPOLAB_TEST_FORK", "1") != "0"
    if fork:
        multiprocessing.set_forkserver_preload(list(PRELOAD[:3]))
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver" if fork else "spawn")


# ------------------------------------------------------------------------------------------------------ the server
def _child(req: dict, started: int, fds: list[int] | None) -> None:
    """In the forked child: become the requested run, then exit as an interpreter does. ``started``: a pipe's write
    end, closed once the child leads its own session (if asked), before the server reports its pid. ``fds``: the
    stdin, stdout and stderr a shell client sent (forkrun_shell.py), else the outputs are ``req``'s paths."""
    import atexit
    import runpy

    code = 1
    try:
        if req.get("session"):
            os.setsid()
        os.close(started)
        for fd in _SERVER_FDS:  # the server's socket and its clients' connections
            with contextlib.suppress(OSError):  # nothing may fail before the outputs are open: a reader waits on them
                os.close(fd)
        if fds:
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
        else:  # in this order: a client reading a named pipe waits in open() for this end
            out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            err = out if req["err"] == req["out"] else os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                                                0o644)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for signum in req.get("ignored", ()):  # what the shell's process ignored (a `&` job: SIGINT), so does the run
            signal.signal(signum, signal.SIG_IGN)
        script = os.path.abspath(req["argv"][0])
        sys.argv = list(req["argv"])
        extra = [entry for entry in req["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[:] = [os.path.dirname(os.path.realpath(script)), *extra, *sys.path[1:]]  # as the interpreter: resolved
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except KeyboardInterrupt:  # as the interpreter: the traceback, then death by SIGINT
            sys.excepthook(*sys.exc_info())
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
            sys.excepthook(*sys.exc_info())
        threading._shutdown()  # noqa: SLF001 - the interpreter's own exit steps: join non-daemon threads,
        atexit._run_exitfuncs()  # noqa: SLF001 - run the atexit handlers, flush the streams
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(code & 0xFF)  # as the interpreter: sys.exit(256) is 0, sys.exit(-1) is 255


_SERVER_FDS: list[int] = []  # descriptors of the server a child closes first


def _fork(req: dict, fds: list[int] | None = None) -> int:
    """Fork a child for ``req``; return its pid once it leads its session (if asked)."""
    sys.stdout.flush()
    sys.stderr.flush()
    started, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(started)
        _child(req, started_w, fds)
    os.close(started_w)
    os.read(started, 1)  # EOF once the child has closed its end
    os.close(started)
    return pid


def _drop(conn) -> None:
    """Close a client's connection, and take it off :data:`_SERVER_FDS` (its number may be reused)."""
    if conn.fileno() in _SERVER_FDS:
        _SERVER_FDS.remove(conn.fileno())
    conn.close()


def _take(conn, own: tuple, clients: dict) -> int | None:
    """Read a shell client's request from ``conn`` (readable, its descriptor in :data:`_SERVER_FDS`): fork its child
    (its pid is returned, ``conn`` kept in ``clients`` for the exit status) or refuse it (another import-time
    environment than ``own``, not three descriptors). A client that died or sent something else than a request is
    dropped: it alone is affected."""
    import socket

    fds: list[int] = []
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        req = json.loads(msg)
        if len(fds) != 3 or _import_time_env(req["env"]) != own:
            conn.send(json.dumps({"refused": "not three descriptors, or another import-time environment"}).encode())
            _drop(conn)
            return None
        pid = _fork(req, fds)
        clients[pid] = conn
        try:
            conn.send(json.dumps({"pid": pid}).encode())
        except OSError:
            pass  # the client has gone; its run goes on, reported to no one
        return pid
    except Exception as e:  # noqa: BLE001 - before any fork: whatever the client sent, the server goes on
        print(f"forkrun: a shell client's request failed: {e!r}", file=sys.stderr, flush=True)
        _drop(conn)
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _listen(socket_path: str):
    """A listening UNIX packet socket at ``socket_path``, or None where one cannot be made (the shell clients then run
    the real interpreter)."""
    import socket

    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(socket_path)
        listener.listen(16)
    except (OSError, AttributeError) as e:
        print(f"forkrun: no socket for shell clients ({e!r})", file=sys.stderr, flush=True)
        return None
    _SERVER_FDS.append(listener.fileno())
    return listener


def _serve(socket_path: str) -> None:
    """Import :data:`PRELOAD`, say ready, then fork a child per request: a JSON line on stdin (answered on stdout
    with its pid, then, once it has exited, its status: ``os.waitstatus_to_exitcode``), or a shell client's packet
    on the socket at ``socket_path`` with its three standard descriptors (answered on that connection the same
    way, or refused). One thread: nothing runs beside a fork."""
    import importlib
    import select

    own = _import_time_env(dict(os.environ))  # before the imports, which may set some
    for name in PRELOAD:
        importlib.import_module(name)
    listener = _listen(socket_path)
    reply = sys.stdout
    print(json.dumps({"ready": True, "socket": listener is not None}), file=reply, flush=True)
    pending, children, clients, unread = b"", set(), {}, []
    while True:
        readable, _, _ = select.select([0, *([listener] if listener else []), *unread], [], [], 0.05)
        if 0 in readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the test process has gone: so do we (children already forked run on)
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                pid = _fork(req)
                children.add(pid)
                print(json.dumps({"id": req["id"], "pid": pid}), file=reply, flush=True)
        if listener is not None and listener in readable:
            unread.append(listener.accept()[0])  # its request is read once it is there: the loop never waits on it
            _SERVER_FDS.append(unread[-1].fileno())  # a child closes it (its own too): the server alone answers
        for conn in [c for c in unread if c in readable]:
            unread.remove(conn)
            if (pid := _take(conn, own, clients)) is not None:
                children.add(pid)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                code = os.waitstatus_to_exitcode(status)
                if pid in clients:
                    conn = clients.pop(pid)
                    try:
                        conn.send(json.dumps({"status": code}).encode())
                    except OSError:
                        pass  # the client has gone
                    _drop(conn)
                else:
                    print(json.dumps({"pid": pid, "status": code}), file=reply, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        from forkrun_shell import client

        client(sys.argv[2:])
    sys.path[0] = str(REPO_ROOT / "src")
    _serve(sys.argv[1])
    os._exit(0)  # no teardown of the imported stack (seconds with torch loaded): the test process has gone
