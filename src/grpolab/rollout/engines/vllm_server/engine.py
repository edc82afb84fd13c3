"""``rollout=vllm_server``: the sampler is a vLLM server in its own process, on its own devices or CPU cores, and
receives the policy's weights once per sampler refresh (every ``algo.steps_per_generation`` steps).

The server is either started by the run (:class:`.process.ServerProcess`: vLLM's OpenAI-compatible server, on
``rollout.server.devices``, stopped with the run) or already running at ``rollout.server.url``. At the first
refresh the engine writes the policy (config + one safetensors file of its full weights, LoRA merged) into
``rollout.server.workdir`` and starts the server on it; that load counts as the first push. Every later refresh
pushes from trainer rank 0 (:mod:`grpolab.rollout.engines.vllm_server.transport`: a shared-memory file the server reloads on CPU,
vLLM's NCCL weight transfer on GPU) and labels the weights ``step<version>-push<n>`` with vLLM's weight-version
endpoint.

A stale sampler cannot pass: the token-in/token-out endpoint reports, for every sampled token, the label of the
weights that sampled it, and a completion sampled with any label but the one promised by the last push stops the
run; after the first two pushes the engine's log-probs are compared with the trainer's on a probe (as the
in-process engine's start-up check), so a push that did not reach the weights stops the run too.

A server this run started that dies is restarted up to ``rollout.server.max_restarts`` times and its failed buffer
resampled from the same weights (:mod:`.restart`); a server given by URL is never restarted.

Requests carry every sampling parameter explicitly (temperature, ``top_p=1``, ``top_k=0``, no penalties, the stop
ids, one seed per completion drawn from torch's RNG) and ask for the sampled tokens' log-probs; the server runs with
``--logprobs-mode processed_logprobs``, so they are ``log_softmax(logits / T)``: log alpha. At most
``rollout.server.max_in_flight`` requests are in flight at once, each bounded by ``rollout.server.request_timeout_s``.

LoRA: the merged weights are pushed, never the adapter (:mod:`grpolab.rollout.engines.vllm_server.transport`).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from grpolab.errors import ConfigError
from grpolab.lora import full_policy_state
from grpolab.plan.sampler_memory import GenerationShape, SamplerMemory
from grpolab.rollout.engines.base import Generation, GenerationEngine, SamplingParams
from grpolab.rollout.engines.completions import to_generation
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.engines.vllm_check import check_push
from grpolab.rollout.engines.vllm_knobs import vllm_memory

from .guards import check_weight_versions
from .process import RequestPool, ServerClient, ServerError, ServerProcess, free_port
from .ranks import barrier, probe_from_rank0, rank_world
from .restart import RestartBudget
from .settings import ServerConfig, check_engine_args, check_startable, server_args
from .transport import FilePush, NcclPush

SERVED_NAME = "grpolab-policy"
STARTUP_CHECKS = 2  # pushes followed by the log-prob probe: the start-up load, and the first reload


class VLLMServerEngine(GenerationEngine):
    """Sample from a vLLM server that receives the policy's weights once per refresh (module docstring).

    Args:
        stop_token_ids: token ids that end a completion.
        pad_token_id: id used to pad completions.
        server: ``rollout.server`` (:class:`~grpolab.rollout.engines.vllm_server.settings.ServerConfig`): where the
            server runs or is, its devices, timeouts, requests in flight and weight transport.
        dtype: the server's weights' dtype; ``auto`` = the policy's (keeps engine and trainer log-probs comparable).
        max_model_len, kv_cache_memory_bytes, gpu_memory_utilization, enforce_eager, max_num_seqs,
            tensor_parallel_size: the server's vLLM settings, as ``rollout=vllm``'s (null = the same defaults:
            1 GiB KV cache and eager mode on CPU).
        recompute_sampler_logp: log alpha from a trainer forward instead of the server's log-probs.
        sync_check_tolerance: the start-up probe's largest mean |engine - trainer| log-prob difference; None =
            1e-3 (float32), 0.05 (16-bit).

    Raises:
        ConfigError: naming ``rollout.<key>`` or ``rollout.server.<key>`` (also raised by :meth:`check_config`
            before any model is built).
        ServerError: the server does not start, dies, stops answering or samples with other weights than promised
            (the refresh restarts a server this run started when :meth:`can_restart` says so).
    """

    owns_weights = True
    reports_sampler_logp = True
    samples_from_module = False  # no trainer-side module holds the sampler's weights

    @classmethod
    def memory_needs(cls, args: dict[str, Any], shape: GenerationShape) -> SamplerMemory:
        """On its own devices: only the kept push (async) and validation cost the trainer (:func:`vllm_memory`)."""
        return vllm_memory(args, shape, own_devices=True)

    @classmethod
    def check_config(cls, args: dict[str, Any]) -> None:
        """Validate ``rollout.*`` and ``rollout.server.*`` before any model is built; with no
        ``rollout.server.url`` the run starts the server, so vLLM must be installed and the port free.

        Raises:
            ConfigError: naming the key. ImportError: vLLM is missing (naming the install command).
        """
        check_startable(check_engine_args(args))

    def __init__(self, stop_token_ids: list[int], pad_token_id: int, server: dict[str, Any] | None = None,
                 dtype: str = "auto", max_model_len: int | None = None, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.9, enforce_eager: bool | None = None,
                 max_num_seqs: int | None = None, tensor_parallel_size: int = 1,
                 recompute_sampler_logp: bool = False, sync_check_tolerance: float | None = None) -> None:
        if not stop_token_ids:
            raise ConfigError("rollout: at least one stop token id is needed")
        if server is not None and not isinstance(server, dict):  # Hydra hands over a DictConfig
            from omegaconf import OmegaConf

            server = OmegaConf.to_container(server, resolve=True)
        self.knobs = dict(dtype=dtype, max_model_len=max_model_len, kv_cache_memory_bytes=kv_cache_memory_bytes,
                          gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                          max_num_seqs=max_num_seqs, tensor_parallel_size=tensor_parallel_size)
        self.settings: ServerConfig = check_engine_args({"server": server or {}, **self.knobs,
                                                           "sync_check_tolerance": sync_check_tolerance})
        self.stop_token_ids = sorted({int(i) for i in stop_token_ids})
        self.pad_token_id = int(pad_token_id)
        self.recompute_sampler_logp = bool(recompute_sampler_logp)
        self.sync_check_tolerance = sync_check_tolerance
        self.sync_check: dict[str, float] = {}
        self.weight_pushes = 0  # pushes that reached the server (the start-up load included)
        self.push_seconds: list[float] = []  # rank 0: each push's wall-clock (write + reload + label)
        self.push_bytes: list[int] = []
        self.keep_sampler_weights = False
        self._kept: dict[str, torch.Tensor] | None = None
        self.process: ServerProcess | None = None
        self.client: ServerClient | None = None
        self._transport: FilePush | NcclPush | None = None
        self._pool: RequestPool | None = None
        self._label: str | None = None  # the weight version the server was promised
        self._version: int | None = None  # the optimizer step of those weights
        self._checks_left = STARTUP_CHECKS
        self.max_len = 0  # the server's context length, read when connecting (0 = unknown)
        self._lock = threading.RLock()
        self.startup_s: float | None = None  # the first start's seconds (a restart costs about as much)
        self._restarts = RestartBudget(self.settings.max_restarts, owned=self.settings.url is None)

    # ------------------------------------------------------------------------------ server life cycle
    def _describe(self) -> str:
        return self.process.describe() if self.process is not None else ""

    def _connect(self, model: Any, state: dict[str, torch.Tensor] | None) -> None:
        """Start the server on ``state`` (rank 0, no ``rollout.server.url``) or reach the given one; then read its
        length limit and make the weight transport (rank 0)."""
        s = self.settings
        rank, world = rank_world()
        url = s.url
        if url is None and rank == 0:
            url = self._start(model, state)
        if url is None or (s.url is None and world > 1):  # the starting rank tells the others where it listens
            box = [url]
            torch.distributed.broadcast_object_list(box, src=0)
            url = box[0]
        self.client = ServerClient(url, self._describe)
        deadline = time.monotonic() + s.startup_timeout_s
        while not self.client.healthy():
            if time.monotonic() > deadline:
                raise ServerError(f"the vLLM server at {url} did not answer /health within "
                                  f"rollout.server.startup_timeout_s={s.startup_timeout_s:g} s{self._describe()}")
            time.sleep(0.5)
        models = self.client.call("/v1/models", None, s.request_timeout_s)["data"]
        self._model_name = models[0]["id"]
        self.max_len = int(models[0].get("max_model_len") or 0)
        self._pool = RequestPool(s.max_in_flight, "vllm-server-request")
        if rank == 0:
            if s.transport(torch.cuda.is_available()) == "nccl":
                device = next(model.parameters()).device
                self._transport = NcclPush(self.client, s.trainer_host or "127.0.0.1", s.nccl_port, device)
            else:
                self._transport = FilePush(self.client, s.push_folder)

    def _start(self, model: Any, state: dict[str, torch.Tensor]) -> str:
        """Write the policy into the work folder and start the server on it (rank 0). Returns its URL."""
        from safetensors.torch import save_file

        from grpolab.distributed import unwrap

        s = self.settings
        workdir = Path(s.workdir) if s.workdir else Path(tempfile.mkdtemp(prefix="grpolab-vllm-server-"))
        policy_dir = workdir / "policy"
        policy_dir.mkdir(parents=True, exist_ok=True)
        base = unwrap(model)
        config = (base.get_base_model() if hasattr(base, "get_base_model") else base).config
        config.save_pretrained(policy_dir)
        save_file({n: t.detach().to("cpu").contiguous().clone() for n, t in state.items()},
                  str(policy_dir / "model.safetensors"))
        dtype = self.knobs["dtype"]
        if dtype == "auto":
            dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
        args, env, cores = server_args(s, self.knobs, str(policy_dir), SERVED_NAME, dtype, torch.cuda.is_available(),
                                       getattr(config, "max_position_embeddings", None))
        port = s.port if s.port is not None else free_port(s.host)
        t0 = time.perf_counter()
        self.process = ServerProcess(args, s.host, port, workdir / "server.log", env=env, cpu_cores=cores)
        self.process.wait_ready(s.startup_timeout_s)
        self._restarts.served = True
        if self.startup_s is None:
            self.startup_s = time.perf_counter() - t0
        return self.process.url

    def close(self) -> None:
        """Stop the server this run started (its whole process group), the request pool and the transport."""
        if self._pool is not None:
            self._pool.shutdown(timeout_s=2.0)  # daemon threads: a request left waiting never holds the exit
            self._pool = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self.process is not None:
            self.process.stop()

    def can_restart(self, err: BaseException) -> bool:
        """True when ``err`` is the failure of a server this run started and served from, in a one-process run,
        with restarts left (``rollout.server.max_restarts``; :mod:`grpolab.rollout.engines.vllm_server.restart`)."""
        return self._restarts.refusal(err, rank_world()[1]) is None

    def restart_note(self, err: BaseException) -> str:
        """Why the server is not restarted after ``err``, naming the setting ("" when it is not the server's)."""
        return self._restarts.refusal(err, rank_world()[1]) or ""

    def restart(self, err: BaseException) -> None:
        """Stop what is left of the failed server and forget it: the next push starts a new one on the weights it
        pushes (the start-up load). The kept weights (:meth:`sampler_state_dict`) survive."""
        with self._lock:
            self._restarts.use(err, self.startup_s)
            self.close()
            self.process, self.client, self._label = None, None, None

    def _fail(self, err: Exception, what: str) -> ServerError:
        """The error that stops the run; a server this run started is stopped first (no process left behind)."""
        tail = self._describe()
        if self.process is not None:
            self.process.stop(timeout_s=5.0)  # the run stops anyway: SIGKILL what is left after 5 s
        return ServerError(f"rollout=vllm_server, step {self._version}: {what}: {err}"
                           + ("" if tail and tail in str(err) else tail))

    # ---------------------------------------------------------------------------------------- weights
    def sync_weights(self, model: Any, version: int) -> None:
        """Push ``model``'s weights (optimizer step ``version``) to the server from rank 0, starting the server at
        the first call. Every rank calls it; under FSDP every rank takes part in gathering the full tensors.

        Raises:
            ServerError: the push failed or timed out, or (first pushes) the probe's log-probs differ.
        """
        with self._lock:
            state = self._state_for_push(model)
            self._push(model, state, f"step{version}-push{self.weight_pushes + 1}", version)

    def _state_for_push(self, model: Any) -> dict[str, torch.Tensor] | None:
        from grpolab.distributed import is_sharded

        rank, _ = rank_world()
        if rank == 0 or is_sharded(model) or self.keep_sampler_weights:
            return full_policy_state(model)  # a collective under FSDP: every rank calls it
        return None

    def _push(self, model: Any, state: dict[str, torch.Tensor] | None, label: str, version: int | None,
              check: bool = True) -> None:
        rank, world = rank_world()
        self._version = version
        if world > 1:  # every rank has finished sampling with the old weights before they change
            barrier(self.settings.push_timeout_s)
        if self.keep_sampler_weights and state is not None:
            self._kept = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        t0 = time.perf_counter()
        if self.client is None:
            self._connect(model, state)
            if rank == 0 and self.process is None:  # a server given by URL: the first push goes over the wire
                self._transport_push(state, label)
            elif rank == 0:
                self.client.call("/update_weight_version", {"new_version": label}, self.settings.push_timeout_s)
                self.push_bytes.append(sum(t.numel() * t.element_size() for t in state.values()))
        elif rank == 0:
            self._transport_push(state, label)
        if rank == 0:
            self.push_seconds.append(time.perf_counter() - t0)
        if world > 1:
            barrier(self.settings.push_timeout_s)
        self._label = label
        self.weight_pushes += 1
        if self._checks_left > 0 and check:
            self._check(model, rank, world)

    def _check(self, model: Any, rank: int, world: int) -> None:
        """The probe of the first pushes (:func:`~grpolab.rollout.engines.vllm_check.check_push`): rank 0 asks the server.
        Under FSDP the trainer's forward is a collective, so every rank runs it on the probe rank 0 received
        (broadcast); otherwise rank 0 checks alone."""
        from grpolab.distributed import is_sharded

        sharded = world > 1 and is_sharded(model)
        if rank != 0 and not sharded:
            return
        self._checks_left -= 1
        sample = self.probe if not sharded else functools.partial(probe_from_rank0, self.probe if rank == 0 else None)
        check_push(self, model, sample=sample)

    def _transport_push(self, state: dict[str, torch.Tensor], label: str) -> None:
        try:
            self.push_bytes.append(self._transport.push(state, label, self.settings.push_timeout_s))
        except ServerError as err:
            raise self._fail(err, f"the weight push ({self._transport.name}) failed") from err

    def keep_sampler_state(self) -> None:
        """Keep a CPU copy of every push from now on (a checkpoint may hold a buffer in flight)."""
        self.keep_sampler_weights = True

    def sampler_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights of the last push (CPU, checkpoint names), for a checkpoint with a buffer in flight.

        Raises:
            RuntimeError: unless :meth:`keep_sampler_state` was called and a push happened since.
        """
        if self._kept is None:
            raise RuntimeError("rollout=vllm_server: no sampler weights kept (keep_sampler_state() not called, or no "
                               "push yet)")
        return dict(self._kept)

    def load_sampler_state_dict(self, state: dict[str, torch.Tensor], like: Any) -> None:
        """Push saved sampler weights (a resumed run's buffer in flight is regenerated from them); ``like`` (the
        policy) is only used to start the server when none runs yet. The probe is left to the next push: the
        saved weights are not the policy's."""
        with self._lock:
            self._push(like, state, f"restored-push{self.weight_pushes + 1}", self._version, check=False)

    def validation_engine(self) -> GenerationEngine:
        """An in-place engine: held-out accuracy is measured on the live policy, not on the last push."""
        return HFGenerationEngine(self.stop_token_ids, self.pad_token_id)

    # ------------------------------------------------------------------------------------- generation
    def _body(self, prompt: list[int], params: SamplingParams, seed: int, ignore_eos: bool = False) -> dict:
        sample = params.do_sample
        sp = dict(n=1, temperature=params.temperature if sample else 0.0, top_p=params.top_p if sample else 1.0,
                  top_k=(params.top_k or 0) if sample else 0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                  frequency_penalty=0.0, max_tokens=params.max_new_tokens, min_tokens=0,
                  stop_token_ids=list(self.stop_token_ids), ignore_eos=ignore_eos, seed=seed, detokenize=False,
                  logprobs=0 if sample else None)
        return {"model": self._model_name, "token_ids": list(prompt), "sampling_params": sp}

    def _request(self, body: dict) -> tuple[list[int], list[float] | None]:
        out = self.client.call("/inference/v1/generate", body, self.settings.request_timeout_s)
        choice = out["choices"][0]
        ids = list(choice.get("token_ids") or [])
        check_weight_versions(choice, self._label, len(ids), self.client.url)
        content = (choice.get("logprobs") or {}).get("content")
        logp = [c["logprob"] for c in content][:len(ids)] if content is not None else None
        return ids, logp

    def _run(self, bodies: list[dict]) -> list[tuple[list[int], list[float] | None]]:
        """All requests, at most ``max_in_flight`` at once; stops at the first failure or when the server dies."""
        futures = [self._pool.submit(self._request, b) for b in bodies]
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            died = self.process is not None and not self.process.alive()
            if failed is not None or died:
                for f in pending:
                    f.cancel()
                err = failed.exception() if failed is not None else ServerError("the server process exited")
                raise self._fail(err, f"sampling from the vLLM server at {self.client.url} failed") from err
        return [f.result() for f in futures]

    @property
    def probe_name(self) -> str:
        """How the start-up check's error names this engine."""
        return f"the vLLM server at {self.client.url if self.client else self.settings.url}"

    def probe(self, prompts: list[list[int]], temperature: float, max_tokens: int) -> list[tuple[list[int], list]]:
        """The start-up check's sampler: ``max_tokens`` tokens per prompt (stop ids ignored, seed 0), log-probs."""
        params = SamplingParams(temperature=temperature, max_new_tokens=max_tokens)
        return self._run([self._body(p, params, seed=0, ignore_eos=True) for p in prompts])

    @torch.no_grad()
    def generate(self, model: Any, prompts: list[list[int]], params: SamplingParams) -> Generation:
        """Sample one completion per prompt on the server (starting it from ``model`` if nothing was pushed yet).

        Returns:
            A CPU :class:`~grpolab.rollout.engines.base.Generation` with ``sampler_logp`` [B, L] float32, the server's
            processed log-probs (None for greedy decoding).

        Raises:
            ValueError: a prompt plus ``max_new_tokens`` exceeds the server's ``max_model_len``.
            ServerError: naming the step, when a request fails, times out or was sampled with other weights.
        """
        with self._lock:
            if self.client is None:
                self._push(model, self._state_for_push(model), "start", None)
        for i, p in enumerate(prompts):
            if self.max_len and len(p) + params.max_new_tokens > self.max_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens + algo.max_completion_length="
                                 f"{params.max_new_tokens} > the server's max_model_len={self.max_len}")
        g = params.generator  # None = torch's global RNG, which the data module seeds at every refresh
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=g,
                              device=g.device if g is not None else None).tolist()
        outs = self._run([self._body(p, params, s) for p, s in zip(prompts, seeds)])
        logps = [lp or [] for _, lp in outs] if params.do_sample else None
        return to_generation(prompts, [ids for ids, _ in outs], logps, self.stop_token_ids, self.pad_token_id)

