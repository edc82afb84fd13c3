"""``rollout.server.*`` of ``rollout=vllm_server``: the settings, their checks (run before any model is built) and
the server's command line. Pure: imports neither vLLM nor Lightning."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from grpolab.errors import ConfigError

CPU_SERVER_BATCHED_TOKENS = 2048      # vLLM's CPU default for vllm serve (engine/arg_utils.py)
CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30  # as rollout=vllm: 1 GiB when rollout.kv_cache_memory_bytes is null on CPU


@dataclass
class ServerConfig:
    """Where the sampler server runs and how the engine talks to it (``conf/rollout/vllm_server.yaml``).

    Attributes:
        url: ``http://host:port`` of a server already running (e.g. on another node); None = the run starts one.
        host: the interface a started server listens on (127.0.0.1: this machine only).
        port: its port; None = a free port picked at start. A port in use is refused, named.
        devices: what a started server may use: GPU indices (``CUDA_VISIBLE_DEVICES``) on a GPU machine, CPU core
            ids on CPU (the server process is pinned to them and vLLM's OpenMP threads bound to them); a list, an
            int, or a string such as ``"2,3"``. None = everything.
        workdir: folder for the server's log and the policy it starts from; None = a temporary folder.
        startup_timeout_s: seconds to wait for a started (or given) server to answer ``/health``.
        request_timeout_s: seconds one generation request may take.
        push_timeout_s: seconds one weight push may take (pause, transfer, reload, relabel).
        max_in_flight: generation requests in flight at once (each one completion).
        weight_transfer: ``auto`` (NCCL when the trainer has a GPU, else a file), ``file`` or ``nccl``.
        push_folder: where the file transport writes; None = a fresh folder under ``/dev/shm``.
        trainer_host: the address the server's workers reach trainer rank 0 at for the NCCL rendezvous.
        nccl_port: the rendezvous port on trainer rank 0.
        extra_args: further ``vllm serve`` arguments for a started server.
        max_restarts: times a started server that dies is restarted per training process (0 = never); a server
            given by ``url`` is never restarted (:mod:`grpolab.rollout.engines.vllm_server.restart`).
    """

    url: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    devices: Any = None
    workdir: str | None = None
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    push_timeout_s: float = 600.0
    max_in_flight: int = 64
    weight_transfer: str = "auto"
    push_folder: str | None = None
    trainer_host: str | None = None
    nccl_port: int = 29555
    extra_args: list[str] = field(default_factory=list)
    max_restarts: int = 1

    def transport(self, trainer_on_gpu: bool) -> str:
        """``file`` or ``nccl``, resolving ``auto``."""
        if self.weight_transfer == "auto":
            return "nccl" if trainer_on_gpu else "file"
        return self.weight_transfer

    def device_list(self) -> list[int] | None:
        """``devices`` as a list of ints (None = all)."""
        d = self.devices
        if d is None:
            return None
        if isinstance(d, int) and not isinstance(d, bool):
            return [d]
        if isinstance(d, str):
            return [int(x) for x in d.replace(" ", "").split(",") if x != ""]
        return [int(x) for x in d]


def _positive(name: str, value: Any, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not (math.isfinite(value) and value > 0):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name} must be {kind} > 0, got {value!r}")


def check_engine_args(args: dict[str, Any]) -> ServerConfig:
    """Validate the engine's part of the ``rollout`` node (``server`` and the vLLM knobs).

    Returns:
        The :class:`ServerConfig`.

    Raises:
        ConfigError: naming ``rollout.server.<key>`` or ``rollout.<key>``, and the fix.
    """
    raw = args.get("server") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"rollout.server must be a mapping of settings, got {raw!r}")
    names = {f.name for f in fields(ServerConfig)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"rollout.server.{unknown[0]} is not a setting of rollout=vllm_server (known: "
                          f"{', '.join(sorted(names))})")
    s = ServerConfig(**raw)
    if s.url is not None and not (isinstance(s.url, str) and s.url.startswith(("http://", "https://"))
                                  and len(s.url.split("://", 1)[1].strip("/")) > 0):
        raise ConfigError(f"rollout.server.url must be null (start a server) or http://host:port, got {s.url!r}")
    if not isinstance(s.host, str) or not s.host:
        raise ConfigError(f"rollout.server.host must be a host name or address, got {s.host!r}")
    if s.port is not None and (isinstance(s.port, bool) or not isinstance(s.port, int) or not 0 < s.port < 65536):
        raise ConfigError(f"rollout.server.port must be null (a free port) or an integer in 1..65535, got {s.port!r}")
    try:
        devices = s.device_list()
    except (TypeError, ValueError):
        devices = [-1]
    if devices is not None and (not devices or any(d < 0 for d in devices)):
        raise ConfigError(f"rollout.server.devices must be null, an index or a list of indices >= 0 (GPUs, or CPU "
                          f"cores on CPU), got {s.devices!r}")
    for key in ("startup_timeout_s", "request_timeout_s", "push_timeout_s"):
        _positive(f"rollout.server.{key}", getattr(s, key))
    _positive("rollout.server.max_in_flight", s.max_in_flight, integer=True)
    if s.weight_transfer not in ("auto", "file", "nccl"):
        raise ConfigError(f"rollout.server.weight_transfer must be auto, file or nccl, got {s.weight_transfer!r}")
    if isinstance(s.nccl_port, bool) or not isinstance(s.nccl_port, int) or not 0 < s.nccl_port < 65536:
        raise ConfigError(f"rollout.server.nccl_port must be an integer in 1..65535, got {s.nccl_port!r}")
    if not isinstance(s.extra_args, list) or not all(isinstance(a, str) for a in s.extra_args):
        raise ConfigError(f"rollout.server.extra_args must be a list of strings, got {s.extra_args!r}")
    if isinstance(s.max_restarts, bool) or not isinstance(s.max_restarts, int) or s.max_restarts < 0:
        raise ConfigError(f"rollout.server.max_restarts must be an integer >= 0 (0 = never restart), got "
                          f"{s.max_restarts!r}")
    if s.url is None and s.port is not None:
        from grpolab.rollout.engines.vllm_server.process import port_in_use

        if port_in_use(s.host, s.port):
            raise ConfigError(f"rollout.server.port={s.port}: port {s.port} on {s.host} is already in use; pick "
                              "another port, or null for a free one")
    _check_knobs(args)
    return s


def _check_knobs(args: dict[str, Any]) -> None:
    dtype = args.get("dtype", "auto")
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"rollout.dtype must be auto|float32|bfloat16|float16, got {dtype!r}")
    for key in ("max_model_len", "kv_cache_memory_bytes", "max_num_seqs"):
        if args.get(key) is not None:
            _positive(f"rollout.{key}", args[key], integer=True)
    _positive("rollout.tensor_parallel_size", args.get("tensor_parallel_size", 1), integer=True)
    gmu = args.get("gpu_memory_utilization", 0.9)
    if isinstance(gmu, bool) or not isinstance(gmu, int | float) or not 0 < gmu <= 1:
        raise ConfigError(f"rollout.gpu_memory_utilization must be in (0, 1], got {gmu!r}")
    if args.get("sync_check_tolerance") is not None:
        _positive("rollout.sync_check_tolerance", args["sync_check_tolerance"])


def server_args(s: ServerConfig, knobs: dict[str, Any], model_dir: str, served_name: str, dtype: str,
                on_gpu: bool, context_len: int | None = None) -> tuple[list[str], dict[str, str], list[int] | None]:
    """The started server's ``vllm serve`` arguments, environment and CPU cores (None: not pinned).

    ``context_len``: the model's ``max_position_embeddings`` (on CPU the server prefills whole prompts only:
    ``--no-enable-chunked-prefill`` with a token budget of at least the context; a chunked prefill of a seeded
    request kills vLLM's CPU engine core, see :mod:`grpolab.rollout.engines.vllm`).

    Fixed choices: no tokenizer (token ids in and out), ``processed_logprobs`` (log alpha), vLLM's own generation
    defaults (the model's ``generation_config.json`` may not change the distribution), prefix caching on,
    ``--enable-scale-out`` (the token-in/token-out endpoint, which reports the weight version of every token) and
    ``VLLM_SERVER_DEV_MODE=1`` (the pause/resume, reload and weight-version endpoints).
    """
    args = ["--model", model_dir, "--served-model-name", served_name, "--dtype", dtype, "--skip-tokenizer-init",
            "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--seed", "0",
            "--enable-prefix-caching", "--enable-scale-out",
            "--tensor-parallel-size", str(knobs.get("tensor_parallel_size") or 1)]
    if knobs.get("max_model_len") is not None:
        args += ["--max-model-len", str(knobs["max_model_len"])]
    if knobs.get("max_num_seqs") is not None:
        args += ["--max-num-seqs", str(knobs["max_num_seqs"])]
    kv = knobs.get("kv_cache_memory_bytes")
    if kv is None and not on_gpu:
        kv = CPU_DEFAULT_KV_CACHE_BYTES
    if kv is not None:
        args += ["--kv-cache-memory-bytes", str(kv)]
    if on_gpu:
        args += ["--gpu-memory-utilization", str(knobs.get("gpu_memory_utilization", 0.9))]
    if not on_gpu:
        context = knobs.get("max_model_len") or context_len
        args.append("--no-enable-chunked-prefill")
        if context:
            args += ["--max-num-batched-tokens", str(max(CPU_SERVER_BATCHED_TOKENS, int(context)))]
    eager = knobs.get("enforce_eager")
    if eager is None and not on_gpu:
        eager = True  # compiling costs ~20 s at start-up on CPU
    if eager:
        args.append("--enforce-eager")
    if s.transport(on_gpu) == "nccl":
        args += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    devices = s.device_list()
    cores = None
    if devices is not None:
        if on_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        else:
            cores = devices
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, devices))
    return args + list(s.extra_args), env, cores


def check_startable(settings: ServerConfig) -> None:
    """With no ``rollout.server.url`` the run starts the server, so vLLM must be installed here.

    Raises:
        ImportError: vLLM is missing (naming the install command and ``rollout.server.url``).
    """
    import importlib.util

    if settings.url is None and importlib.util.find_spec("vllm") is None:
        from grpolab.rollout.engines.vllm import INSTALL_HINT

        raise ImportError("rollout=vllm_server starts a vLLM server (rollout.server.url is null), and vLLM is not "
                          f"installed here. Install it with {INSTALL_HINT}, or give rollout.server.url")
