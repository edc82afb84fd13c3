"""The vLLM server process and its HTTP client, for ``rollout=vllm_server``
(:mod:`grpolab.rollout.engines.vllm_server.engine`).

:class:`ServerProcess` starts vLLM's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``,
what ``vllm serve`` runs) as a child of the training process, in its own session (process group), pinned to the
devices or CPU cores it is given, with its log in a file; it stops the whole group at :meth:`ServerProcess.stop`, at
interpreter exit, and (Linux) when the training process dies. :class:`ServerClient` makes JSON calls with a timeout
on every call. Nothing here imports vLLM: the trainer needs it only to start a server or for the NCCL push.

The server runs with ``VLLM_SERVER_DEV_MODE=1``, which turns on vLLM's control endpoints that the engine uses:
``/collective_rpc``, ``/pause``, ``/resume``, ``/update_weight_version``, ``/weight_info``, ``/reset_prefix_cache``
and the weight-transfer endpoints; ``--enable-scale-out`` turns on the token-in/token-out ``/inference/v1/generate``,
whose answers say which weight version sampled each token. These endpoints have no authentication: bind the
server to a private interface.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 20


class ServerError(RuntimeError):
    """The sampler server did not start, stopped answering, or refused a request. The message names the URL
    and, for a server this run started, ends with the last lines of its log."""


def port_in_use(host: str, port: int) -> bool:
    """True when ``host:port`` cannot be bound (another process listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerClient:
    """JSON over HTTP to one server, every call bounded by a timeout.

    Args:
        url: ``http://host:port`` (no trailing slash needed).
        describe: returns extra context for error messages (the server log's tail); called only on errors.
    """

    def __init__(self, url: str, describe: Any = None) -> None:
        self.url = url.rstrip("/")
        self.describe = describe or (lambda: "")

    def call(self, path: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0,
             method: str | None = None) -> Any:
        """``POST`` ``body`` (or ``GET`` when None) to ``path``; returns the decoded JSON (None for an empty body).

        Raises:
            ServerError: on an HTTP error status (with the server's message), a refused connection, or no answer
                within ``timeout_s`` seconds.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method or ("GET" if body is None else "POST"),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:2000]
            raise ServerError(f"the vLLM server at {self.url} refused {path} (HTTP {err.code}): {detail}"
                              f"{self.describe()}") from err
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            what = (f"did not answer {path} within {timeout_s:g} s" if isinstance(reason, TimeoutError | socket.timeout)
                    else f"dropped {path} ({reason})")
            raise ServerError(f"the vLLM server at {self.url} {what}{self.describe()}") from err
        return json.loads(raw) if raw.strip() else None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """True when ``/health`` answers 200 within ``timeout_s``."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout_s) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, TimeoutError):
            return False


class RequestPool:
    """At most ``max_workers`` requests at once, in daemon threads: a request still waiting on a server (up to
    ``rollout.server.request_timeout_s``) never holds the process's exit, as ``concurrent.futures``' threads do
    (they are joined at interpreter exit).

    Args:
        max_workers: threads at most (started as needed, then kept).
        name: the threads' name prefix.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers, self.name = int(max_workers), name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Any, *args: Any) -> cf.Future:
        """Run ``fn(*args)`` in a pool thread. Returns its future. Raises RuntimeError after :meth:`shutdown`."""
        if self._closed:
            raise RuntimeError(f"{self.name}: the request pool is shut down")
        future: cf.Future = cf.Future()
        self._jobs.put((future, fn, args))
        if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
            t = threading.Thread(target=self._loop, name=f"{self.name}-{len(self._threads)}", daemon=True)
            t.start()
            self._threads.append(t)
        return future

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
                    future.set_exception(err)
            self._idle.release()

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Cancel the requests not started, and wait at most ``timeout_s`` in all for those in flight (their
        threads are daemons: one still waiting on a server is left to its own timeout). Idempotent."""
        self._closed = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM the server when the training process dies (prctl PR_SET_PDEATHSIG), so a killed trainer
    leaves no server behind; the server then stops its own engine processes."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class ServerProcess:
    """A vLLM server started by this run, in its own process group.

    Args:
        args: the server's command-line arguments after ``python -m vllm.entrypoints.openai.api_server``.
        host, port: where it listens (the port must be free: checked before starting).
        log_path: its stdout and stderr.
        env: extra environment variables (device pinning, vLLM settings).
        cpu_cores: on CPU, the cores the server may use (``os.sched_setaffinity`` on the child); None = all.
        launcher: the command before the arguments; None = ``[sys.executable, "-m",
            "vllm.entrypoints.openai.api_server"]`` (this interpreter, whose environment has vLLM).

    Raises:
        ServerError: the port is in use (named), or the server did not answer ``/health`` within
            ``startup_timeout_s`` of :meth:`wait_ready` (naming the URL and the log's last lines).
    """

    def __init__(self, args: list[str], host: str, port: int, log_path: Path, env: dict[str, str] | None = None,
                 cpu_cores: list[int] | None = None, launcher: list[str] | None = None) -> None:
        self.url = f"http://{host}:{port}"
        if port_in_use(host, port):
            raise ServerError(f"rollout.server.port={port}: port {port} on {host} is already in use by another "
                              f"process; pick another port or null (a free one)")
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        launcher = launcher or [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        self.cmd = [*launcher, "--host", host, "--port", str(port), *args]
        full_env = {**os.environ, **(env or {})}
        self._log = self.log_path.open("ab")
        preexec = None
        if cpu_cores is not None or sys.platform.startswith("linux"):
            def preexec() -> None:  # pragma: no cover - runs in the child
                _die_with_parent()
                if cpu_cores is not None:
                    os.sched_setaffinity(0, cpu_cores)
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True, preexec_fn=preexec)
        self.client = ServerClient(self.url, self.describe)
        atexit.register(self.stop)
        cores = f" on CPU cores {cpu_cores}" if cpu_cores is not None else ""
        log.info("starting a vLLM server at %s%s (pid %d); its log: %s", self.url, cores, self.proc.pid, self.log_path)

    def alive(self) -> bool:
        """True while the server's main process runs."""
        return self.proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            text = self.log_path.read_bytes()[-20000:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe(self) -> str:
        """What an error message appends: the exit status if the server stopped, and its log's last lines."""
        state = "" if self.alive() else f" (the server process exited with status {self.proc.returncode})"
        return f"{state}; last lines of {self.log_path}:\n{self.log_tail()}"

    def wait_ready(self, startup_timeout_s: float) -> None:
        """Wait until ``/health`` answers.

        Raises:
            ServerError: the server exited, or did not answer within ``startup_timeout_s`` (then it is stopped).
        """
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                self.stop()
                raise ServerError(f"the vLLM server at {self.url} exited while starting{self.describe()}")
            if self.client.healthy(timeout_s=min(2.0, max(0.1, deadline - time.monotonic()))):
                return
            time.sleep(0.5)
        tail = self.describe()
        self.stop()
        raise ServerError(f"the vLLM server at {self.url} did not come up within rollout.server.startup_timeout_s="
                          f"{startup_timeout_s:g} s{tail}")

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after ``timeout_s``). Idempotent."""
        if self.proc.poll() is None or self._group_alive():
            for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and (self.proc.poll() is None or self._group_alive()):
                    time.sleep(0.1)
                if not self._group_alive():
                    break
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        if not self._log.closed:
            self._log.close()
        atexit.unregister(self.stop)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
