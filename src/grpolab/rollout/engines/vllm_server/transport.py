"""How ``rollout=vllm_server`` pushes the policy's weights into a running vLLM server, once per sampler refresh.

Two transports, both driven over the server's HTTP control endpoints and both ending with vLLM's
``/update_weight_version``, so the label the server reports on every sampled token is the push's:

* :class:`FilePush` (CPU, and any server on the same machine): the full state dict is written as one safetensors
  file into a folder (``/dev/shm`` by default: a memory-backed file, so writing it is a memory copy), then the
  server's workers reload it in place with vLLM's own ``reload_weights(weights_path=..., is_checkpoint_format=True)``
  through the ``/collective_rpc`` endpoint, the layer-wise reload the in-process engine uses. No worker extension
  is needed: vLLM 0.32 ships every piece.
* :class:`NcclPush` (GPU): vLLM's weight-transfer API (``--weight-transfer-config '{"backend": "nccl"}'`` on the
  server; ``NCCLTrainerWeightTransferEngine`` with the ``HTTPVLLMWeightSyncClient`` on the trainer), which
  broadcasts the tensors in packed buckets from trainer rank 0 to the server's workers over NCCL. Written
  against vLLM 0.32's source; no test runs it (the tests run on CPU).

A push is never skipped silently: every failure raises :class:`~grpolab.rollout.engines.vllm_server.process.ServerError`.

LoRA: the merged weights are pushed (:func:`grpolab.lora.full_policy_state`), never the adapter: vLLM would need
``--enable-lora`` and a LoRA-aware load per push, its LoRA kernels sample with other rounding than the merged
weights the trainer's log-probs are compared with, and a merged push costs the same bytes as any full push.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from grpolab.rollout.engines.vllm_server.process import ServerClient, ServerError

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
PUSH_PREFIX = "grpolab-push-"  # + the owner's pid + "-" + a random suffix


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of the tensors of a state dict (what a push moves)."""
    return sum(t.numel() * t.element_size() for t in state.values())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale_push_folders(base: str | Path) -> list[Path]:
    """Remove the push folders (``grpolab-push-<pid>-*``) under ``base`` whose owning process is gone (a run killed
    with SIGKILL or by the OOM killer never ran its clean-up; each holds a model-sized file in memory).

    Returns:
        The folders removed. A folder of a live process, or one that cannot be removed, is left in place.
    """
    removed = []
    for path in Path(base).glob(f"{PUSH_PREFIX}*"):
        pid = path.name[len(PUSH_PREFIX):].split("-", 1)[0]
        if path.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(path)
                log.warning("removed %s, the weight-push folder of a run (pid %s) that ended without cleaning up",
                            path, pid)
    return removed


def _begin(client: ServerClient, timeout_s: float) -> None:
    """Let requests still running finish, and hold new ones until :func:`_end` (vLLM's ``/pause?mode=wait``)."""
    client.call("/pause?mode=wait&clear_cache=false", {}, timeout_s)


def _end(client: ServerClient, label: str, timeout_s: float) -> None:
    """Label the new weights, drop KV blocks computed with the old ones, and let requests run again."""
    client.call("/update_weight_version", {"new_version": label}, timeout_s)
    client.call("/reset_prefix_cache", {}, timeout_s)
    client.call("/resume", {}, timeout_s)
    got = client.call("/weight_info", None, timeout_s).get("weight_version")
    if got != label:
        raise ServerError(f"the vLLM server at {client.url} reports weight version {got!r} after the push of "
                          f"{label!r}{client.describe()}")


class FilePush:
    """Write the weights as a safetensors file, then have the server reload them from it.

    Args:
        client: the server's client.
        folder: where the file is written (must be readable by the server: same machine). None = a fresh folder
            under ``/dev/shm`` when it exists (memory-backed), else under the system's temporary folder.
    """

    name = "file"
    last_timing: dict[str, float] = {}  # the last push's seconds: writing the file, and the server's reload

    def __init__(self, client: ServerClient, folder: str | None = None) -> None:
        self.client = client
        if folder is None:
            base = "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()
            sweep_stale_push_folders(base)
            # removed at close, at interpreter exit (the finalizer) and, after a kill -9 or an OOM kill, by the
            # next run's sweep: the owner's pid is in the name
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{PUSH_PREFIX}{os.getpid()}-", dir=base)
            self.folder = Path(self._tmp.name)
        else:
            self._tmp = None
            self.folder = Path(folder)
            self.folder.mkdir(parents=True, exist_ok=True)

    def push(self, state: dict[str, torch.Tensor], label: str, timeout_s: float) -> int:
        """Push ``state`` (checkpoint names, full tensors) and label it ``label``. Returns the bytes written.

        Raises:
            ServerError: the server refused or did not finish the reload within ``timeout_s`` seconds.
        """
        from safetensors.torch import save_file

        seen: dict[int, str] = {}
        tensors: dict[str, torch.Tensor] = {}
        for name, t in state.items():  # safetensors refuses shared storage (a tied lm_head): copy those
            t = t.detach().to("cpu")
            key = t.untyped_storage().data_ptr()
            tensors[name] = t.contiguous().clone() if key in seen or not t.is_contiguous() else t
            seen.setdefault(key, name)
        t0 = time.perf_counter()
        tmp = self.folder / (WEIGHTS_FILE + ".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(self.folder / WEIGHTS_FILE)  # the server never sees a half-written file
        t1 = time.perf_counter()
        _begin(self.client, timeout_s)
        self.client.call("/collective_rpc", {"method": "reload_weights", "timeout": timeout_s,
                                             "kwargs": {"weights_path": str(self.folder), "is_checkpoint_format": True}},
                         timeout_s + 5)
        _end(self.client, label, timeout_s)
        self.last_timing = {"write_s": t1 - t0, "reload_s": time.perf_counter() - t1}
        return state_bytes(tensors)

    def close(self) -> None:
        """Remove the folder this push created (a folder it was given is left in place)."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp.name, ignore_errors=True)


class _StateSource:
    """vLLM's ``WeightSource`` over the state dict of the current push (rebuilt each push, same names)."""

    def __init__(self) -> None:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        class Source(WeightSource):
            state: dict[str, torch.Tensor] = {}

            def metadata(self) -> list[Any]:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.state.items()]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                yield from self.state.items()

        self.source = Source()


class NcclPush:
    """vLLM's NCCL weight transfer from trainer rank 0 (GPU only; not covered by the tests).

    Args:
        client: the server's client.
        trainer_host: the address the server's workers reach the trainer at (the NCCL rendezvous).
        port: the rendezvous port on the trainer.
        device: the trainer's CUDA device the tensors are broadcast from.
    """

    name = "nccl"

    def __init__(self, client: ServerClient, trainer_host: str, port: int, device: torch.device) -> None:
        self.client, self.trainer_host, self.port, self.device = client, trainer_host, port, device
        self._engine: Any = None
        self._source: Any = None

    def _connect(self, timeout_s: float) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        workers = int(self.client.call("/get_world_size", None, timeout_s)["world_size"])
        self._source = _StateSource().source
        info = NCCLTrainerInitInfo(master_address=self.trainer_host, master_port=self.port,
                                   world_size=1 + workers, rank=0)
        http = HTTPVLLMWeightSyncClient(self.client.url, timeout=timeout_s)
        self._engine = WeightTransferTrainerFactory.trainer_init(info, client=http, source=self._source)

    def push(self, state: dict[str, torch.Tensor], label: str, timeout_s: float) -> int:
        """Broadcast ``state`` to the server's workers in packed buckets and label it ``label``; returns the bytes.

        Raises:
            ServerError: a control call failed or timed out (the NCCL broadcast itself is bounded by NCCL's own
                timeout, set by the process group).
        """
        if self._engine is None:
            self._connect(timeout_s)
        self._source.state = {n: t.detach().to(self.device).contiguous() for n, t in state.items()}
        _begin(self.client, timeout_s)
        try:
            self._engine.send_weights()
        except Exception as err:  # requests' errors and NCCL errors alike: a push never fails silently
            raise ServerError(f"the NCCL weight push to {self.client.url} failed: {err}{self.client.describe()}") \
                from err
        _end(self.client, label, timeout_s)
        return state_bytes(self._source.state)

    def close(self) -> None:
        """Tear down the NCCL group."""
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
