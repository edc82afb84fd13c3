"""rollout=vllm_server without vLLM: its settings are refused before any model is built, naming the key, and the
server process wrapper's faults (a port in use, a server that never answers or exits at start) are named, with the
log's last lines, and leave no process behind. The vLLM-backed tests are in tests/vllm_extra/test_vllm_server.py."""

from __future__ import annotations

import socket
import sys
import time

import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg
from omegaconf import OmegaConf

from grpolab.config import GRPOConfig
from grpolab.errors import ConfigError
from grpolab.rollout.engines.vllm_server.process import ServerError, ServerProcess, free_port
from grpolab.rollout.settings import resolve_rollout


def _resolve(tmp_path, *overrides):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "rollout=vllm_server", *overrides])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    return resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)


@pytest.mark.parametrize(("override", "key"), [
    ("rollout.server.url=localhost:8000", "rollout.server.url"),
    ("rollout.server.startup_timeout_s=0", "rollout.server.startup_timeout_s"),
    ("rollout.server.request_timeout_s=-1", "rollout.server.request_timeout_s"),
    ("rollout.server.push_timeout_s=.nan", "rollout.server.push_timeout_s"),
    ("rollout.server.max_in_flight=0", "rollout.server.max_in_flight"),
    ("rollout.server.port=70000", "rollout.server.port"),
    ("rollout.server.devices=[-1]", "rollout.server.devices"),
    ("rollout.server.weight_transfer=gloo", "rollout.server.weight_transfer"),
    ("rollout.server.max_restarts=-1", "rollout.server.max_restarts"),
    ("rollout.server.max_restarts=true", "rollout.server.max_restarts"),
    ("+rollout.server.timeout=3", "rollout.server.timeout"),
    ("rollout.dtype=int8", "rollout.dtype"),
    ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization"),
])
def test_bad_settings_are_config_errors_naming_the_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _resolve(tmp_path, override)


def test_a_port_in_use_is_named_before_anything_is_built(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"rollout\.server\.port={port}: port {port} .* already in use"):
            _resolve(tmp_path, f"rollout.server.port={port}")
        with pytest.raises(ServerError, match=rf"port {port} on 127\.0\.0\.1 is already in use"):
            ServerProcess([], "127.0.0.1", port, tmp_path / "log", launcher=[sys.executable, "-c", "pass"])


def test_a_given_url_needs_no_vllm_and_async_is_allowed(tmp_path):
    cls, args, settings = _resolve(tmp_path, "rollout.server.url=http://10.0.0.2:8000", "algo=grpo_offpolicy",
                                   "rollout.async_generation=true")
    assert cls.__name__ == "VLLMServerEngine" and settings.async_generation and cls.owns_weights
    assert args["server"]["url"] == "http://10.0.0.2:8000"


def _group_gone(proc: ServerProcess) -> bool:
    return not proc._group_alive()


def test_a_server_that_never_answers_times_out_naming_the_url_and_the_log_tail(tmp_path):
    # a real child process that logs and sleeps (with a grandchild, like vLLM's engine core) but never listens
    script = ("import subprocess, sys, time; print('booting the engine', flush=True); "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    port = free_port("127.0.0.1")
    proc = ServerProcess([], "127.0.0.1", port, tmp_path / "server.log", launcher=[sys.executable, "-c", script])
    start = time.monotonic()
    with pytest.raises(ServerError, match=rf"(?s)http://127\.0\.0\.1:{port} did not come up within "
                                          r"rollout\.server\.startup_timeout_s=3 s.*booting the engine"):
        proc.wait_ready(3)
    assert time.monotonic() - start < 20
    assert _group_gone(proc)  # the grandchild too


def test_a_server_that_exits_at_start_is_reported_with_its_status(tmp_path):
    script = "import sys; print('no such model', flush=True); sys.exit(3)"
    proc = ServerProcess([], "127.0.0.1", free_port("127.0.0.1"), tmp_path / "server.log",
                         launcher=[sys.executable, "-c", script])
    with pytest.raises(ServerError, match=r"(?s)exited while starting \(.*status 3\).*no such model"):
        proc.wait_ready(30)
    assert _group_gone(proc)


def test_a_given_url_that_never_answers_is_named_within_the_startup_timeout(tmp_path):
    from grpolab.models import TinyCharModel
    from grpolab.rollout.engines.vllm_server.engine import VLLMServerEngine

    port = free_port("127.0.0.1")  # nothing listens there
    spec = TinyCharModel(warmstart=None, hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64)
    engine = VLLMServerEngine([1], 0, server={"url": f"http://127.0.0.1:{port}", "startup_timeout_s": 2})
    policy = spec.load_policy(None)
    start = time.monotonic()
    with pytest.raises(ServerError, match=rf"127\.0\.0\.1:{port} did not answer /health within "
                                          r"rollout\.server\.startup_timeout_s=2 s"):
        engine.sync_weights(policy, 0)
    assert time.monotonic() - start < 10
    engine.close()


def test_a_started_cpu_server_prefills_whole_prompts():
    from grpolab.rollout.engines.vllm_server.settings import ServerConfig, server_args

    knobs = {"tensor_parallel_size": 1, "max_model_len": None}
    cpu, _, _ = server_args(ServerConfig(), knobs, "/m", "policy", "float32", on_gpu=False, context_len=32768)
    # a chunked prefill of a seeded request kills vLLM's CPU engine core: whole prompts, a budget of the context
    assert "--no-enable-chunked-prefill" in cpu
    assert cpu[cpu.index("--max-num-batched-tokens") + 1] == "32768"
    small, _, _ = server_args(ServerConfig(), {**knobs, "max_model_len": 64}, "/m", "policy", "float32",
                              on_gpu=False, context_len=32768)
    assert small[small.index("--max-num-batched-tokens") + 1] == "2048"  # never below vLLM's own CPU budget
    gpu, _, _ = server_args(ServerConfig(), knobs, "/m", "policy", "bfloat16", on_gpu=True, context_len=32768)
    assert "--no-enable-chunked-prefill" not in gpu and "--max-num-batched-tokens" not in gpu


def test_the_restart_budget_restarts_only_a_started_server_that_served_and_names_why_not():
    from grpolab.rollout.engines.vllm_server.restart import RestartBudget

    died = ServerError("the vLLM server at http://127.0.0.1:1 dropped /pause")
    given = RestartBudget(2, owned=False)
    given.served = True
    assert given.refusal(died, 1) == "not restarted (a server given by rollout.server.url is never restarted)"
    budget = RestartBudget(1, owned=True)
    assert budget.refusal(died, 1) == ""  # never came up: a start-up failure is not restarted
    budget.served = True
    assert budget.refusal(ValueError("prompt too long"), 1) == ""  # not the server's failure
    assert budget.refusal(died, 1) is None and "max_restarts applies to a run with one" in budget.refusal(died, 2)
    budget.use(died, 30.0)
    assert budget.refusal(died, 1) == "not restarted again (rollout.server.max_restarts=1, 1 used)"
    assert RestartBudget(0, owned=True).refusal(died, 1) == ""
    never = RestartBudget(0, owned=True)
    never.served = True
    assert never.refusal(died, 1) == "not restarted (rollout.server.max_restarts=0)"
