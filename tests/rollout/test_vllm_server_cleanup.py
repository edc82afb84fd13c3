"""rollout=vllm_server leaves nothing behind: no weight-push folder in /dev/shm after a killed run, no request
thread that holds the exit. Needs no vLLM (the file push's folder and the request pool are plain Python)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from grpolab.rollout.engines.vllm_server.process import ServerClient
from grpolab.rollout.engines.vllm_server.transport import PUSH_PREFIX, FilePush

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}


def test_a_push_folder_of_a_killed_run_is_removed_by_the_next_run():
    # the run that owns a push folder is SIGKILLed (an OOM kill): no clean-up runs in it
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from grpolab.rollout.engines.vllm_server.process import ServerClient
        from grpolab.rollout.engines.vllm_server.transport import FilePush
        push = FilePush(ServerClient("http://127.0.0.1:9"))
        (push.folder / "model.safetensors").write_bytes(b"0" * 4096)
        print(push.folder, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        stale = Path(owner.stdout.readline().strip())
        assert stale.name.startswith(f"{PUSH_PREFIX}{owner.pid}-") and stale.is_dir()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert stale.is_dir()  # what a killed run leaves
        push = FilePush(ServerClient("http://127.0.0.1:9"))  # the next run
        try:
            assert not stale.exists()
            assert push.folder.name.startswith(f"{PUSH_PREFIX}{os.getpid()}-") and push.folder.is_dir()
            again = FilePush(ServerClient("http://127.0.0.1:9"))  # a live owner's folder is left alone
            assert push.folder.is_dir()
            again.close()
        finally:
            push.close()
        assert not push.folder.exists()
    finally:
        owner.kill()
        owner.wait()


def test_a_push_folder_goes_at_exit_after_an_error():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from grpolab.rollout.engines.vllm_server.process import ServerClient
        from grpolab.rollout.engines.vllm_server.transport import FilePush
        push = FilePush(ServerClient("http://127.0.0.1:9"))
        print(push.folder, flush=True)
        raise RuntimeError("the run fails, close() is never called")
    """)], capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode == 1 and not Path(out.stdout.strip()).exists()


def test_requests_to_a_server_that_stopped_answering_do_not_hold_the_exit():
    # a server given by URL that accepts connections and never answers (hung, or SIGSTOPped): four requests with a
    # 300 s timeout are in flight when the run fails; the process must exit within seconds, not 300 s
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        code = textwrap.dedent(f"""
            import time
            from grpolab.rollout.engines.vllm_server.process import RequestPool, ServerClient
            client = ServerClient({url!r})
            pool = RequestPool(4, "vllm-server-request")
            futures = [pool.submit(client.call, "/inference/v1/generate", {{"token_ids": [1]}}, 300.0)
                       for _ in range(6)]
            time.sleep(1.0)
            assert not any(f.done() for f in futures)
            t0 = time.monotonic()
            pool.shutdown(timeout_s=1.0)
            assert time.monotonic() - t0 < 1.5 and all(f.cancelled() for f in futures[4:])
            raise RuntimeError("sampling from the vLLM server failed")
        """)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
        took = time.monotonic() - t0
    assert out.returncode == 1 and "sampling from the vLLM server failed" in out.stderr, out.stderr[-2000:]
    assert took < 20, f"the exit took {took:.0f} s"
