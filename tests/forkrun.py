"""``subprocess.run`` for ``python src/train.py`` and ``python src/eval.py``, forked from a process that has already
imported the training stack.

Every ``src/train.py`` process spends about 7 CPU s importing torch, Lightning (which imports ``torch._dynamo`` and
torchmetrics, which imports ``scipy.signal``) and transformers before its first step, far more than a tiny test run
trains. :func:`run` takes the same arguments as :func:`subprocess.run` and, for a plain run of one of the two entry
points of this checkout, asks a *fork server* (this file run as a script, one per xdist worker and import-time
environment) to fork a child that sets up the request's working folder, environment, arguments and output files, runs
the script as ``__main__`` (:func:`runpy.run_path`) and exits as the interpreter would (non-daemon threads joined,
``atexit`` handlers run, streams flushed). The server imports and does nothing else: no tensor, no thread, no
logging set-up, so a child starts from the state a fresh interpreter reaches after the same imports.

What a child does not share with a fresh ``python src/train.py``: warnings and prints of the imports themselves
(they went to the server's stderr once), and environment variables read at import time. So a request whose
import-time environment (:data:`IMPORT_TIME_VARS`) differs from the server's gets a server of its own, and these
run as real processes (:func:`subprocess.run` itself): any other command, a script outside this checkout's ``src/``,
``input=``, ``GRPOLAB_TEST_FORK=0`` in the environment. Tests whose subject is the process (signals to a process
group, a real shell, the console output, import-time warnings, exit codes of a dying interpreter) call
:mod:`subprocess` directly.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {REPO_ROOT / "src" / "train.py", REPO_ROOT / "src" / "eval.py"}
IMPORT_TIME_VARS = ("HF_", "TRANSFORMERS_", "HUGGINGFACE_", "TORCH", "PYTORCH_", "ATEN_", "ONEDNN_", "DNNL_", "MKL_",
                    "OMP_", "KMP_", "PYTHON", "LD_", "MALLOC_", "GLIBC_", "CUDA_", "TOKENIZERS_", "SCIPY_", "MPL")
PRELOAD = ("torch", "lightning.pytorch", "transformers", "hydra", "omegaconf", "grpolab.app.cli",
           "grpolab.app.console", "grpolab.app.sweep_jobs", "grpolab.app.plan_from_config", "grpolab.app.run")


def _import_time_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_VARS)))


class _Server:
    """One fork server: a child process of this one, requests on its stdin, replies on its stdout (JSON lines)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lock = threading.Lock()
        if self._read(None) != {"ready": True}:
            raise RuntimeError("the fork server did not start")

    def _read(self, timeout: float | None) -> dict | None:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server exited ({self.proc.poll()})")
        return json.loads(line)

    def run(self, argv: list[str], cwd: str, env: dict[str, str], out: str, err: str, timeout: float | None) -> int:
        with self.lock:
            self.proc.stdin.write(json.dumps({"argv": argv, "cwd": cwd, "env": env, "out": out, "err": err}) + "\n")
            pid = self._read(None)["pid"]
            reply = self._read(timeout)
            if reply is None:
                os.kill(pid, signal.SIGKILL)
                self._read(None)
                raise subprocess.TimeoutExpired(argv, timeout)
            return reply["status"]


_servers: dict[tuple, _Server] = {}
_servers_lock = threading.Lock()


def _server(env: dict[str, str]) -> _Server:
    key = _import_time_env(env)
    with _servers_lock:
        if key not in _servers or _servers[key].proc.poll() is not None:
            _servers[key] = _Server(env)
        return _servers[key]


def _forkable(cmd, kwargs: dict) -> bool:
    if not isinstance(cmd, (list, tuple)) or len(cmd) < 2 or cmd[0] != sys.executable or kwargs.get("input"):
        return False
    script = Path(kwargs.get("cwd") or os.getcwd(), cmd[1]).resolve()
    env = kwargs.get("env") or os.environ
    return script in SCRIPTS and env.get("GRPOLAB_TEST_FORK", "1") != "0" and not kwargs.get("shell")


def run(cmd, *, capture_output: bool = False, text: bool = False, timeout: float | None = None, check: bool = False,
        cwd=None, env=None, stdout=None, stderr=None, **kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run`, forked from a server that has imported the stack when ``cmd`` is
    ``[sys.executable, <this checkout>/src/{train,eval}.py, ...]`` (see the module docstring), else passed on.

    Supports ``capture_output``/``stdout``/``stderr`` of ``PIPE`` or ``DEVNULL``, ``text``, ``timeout``, ``check``,
    ``cwd`` and ``env``; anything else goes to a real process.

    Raises:
        subprocess.TimeoutExpired: the run took longer than ``timeout`` (the child is killed).
        subprocess.CalledProcessError: ``check`` and a non-zero exit status.
    """
    plain = (stdout in (None, subprocess.PIPE, subprocess.DEVNULL) and stderr in (None, subprocess.PIPE,
                                                                                 subprocess.DEVNULL, subprocess.STDOUT))
    passed = dict(capture_output=capture_output, text=text, timeout=timeout, check=check, cwd=cwd, env=env,
                  stdout=stdout, stderr=stderr, **kwargs)
    if kwargs or not plain or not _forkable(cmd, passed):
        if capture_output:
            passed.pop("stdout"), passed.pop("stderr")
        return subprocess.run(cmd, **passed)
    env = dict(os.environ if env is None else env)
    cwd = str(Path(cwd or os.getcwd()).resolve())
    want_out = capture_output or stdout == subprocess.PIPE
    want_err = capture_output or stderr == subprocess.PIPE
    with tempfile.TemporaryDirectory(prefix="forkrun-") as tmp:
        out = os.path.join(tmp, "out")
        err = out if stderr == subprocess.STDOUT else os.path.join(tmp, "err")
        status = _server(env).run([str(c) for c in cmd[1:]], cwd, env, out if want_out or stdout is None else os.devnull,
                                  err if want_err or stderr is None else os.devnull, timeout)
        got = {}
        for name, path, want, dest in (("stdout", out, want_out, stdout), ("stderr", err, want_err, stderr)):
            if want and os.path.exists(path):
                data = Path(path).read_bytes()
                got[name] = data.decode() if text else data
            elif dest is None and os.path.exists(path) and path != os.devnull:  # not captured: show it as a run would
                (sys.stdout if name == "stdout" else sys.stderr).write(Path(path).read_text(errors="replace"))
    proc = subprocess.CompletedProcess(cmd, status, got.get("stdout"), got.get("stderr"))
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

    multiprocessing.set_forkserver_preload(list(PRELOAD[:3]))
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


# ------------------------------------------------------------------------------------------------------ the server
def _child(req: dict) -> None:
    """In the forked child: become the requested run, then exit as an interpreter does."""
    import atexit
    import runpy

    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = out if req["err"] == req["out"] else os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        script = os.path.abspath(req["argv"][0])
        sys.argv = [req["argv"][0], *req["argv"][1:]]
        sys.path[0] = os.path.dirname(script)
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
            sys.excepthook(*sys.exc_info())
        threading._shutdown()  # noqa: SLF001 - the interpreter's own exit step: join non-daemon threads
        atexit._run_exitfuncs()  # noqa: SLF001
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    finally:
        os._exit(code if 0 <= code < 256 else 1)


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    reply = sys.stdout
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        reply.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)


if __name__ == "__main__":
    sys.path[0] = str(REPO_ROOT / "src")
    _serve()
