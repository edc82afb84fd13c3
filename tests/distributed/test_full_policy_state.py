"""The weights a sampler engine's push loads are full tensors under FSDP2 (trainer=fsdp): two gloo processes
shard a tiny policy (plain and LoRA) and ``full_policy_state`` must hand back exactly the unsharded weights."""

from __future__ import annotations

import copy
import os
import socket

import forkrun
import pytest
import torch
import torch.distributed as dist
from conftest import TINY_ARCH

from grpolab.distributed import is_sharded, shard_models
from grpolab.lora import LoraAdapterConfig, apply_lora, full_policy_state, merged_state_dict
from grpolab.models import build_char_tokenizer, random_qwen2

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")


def _policy(lora: bool) -> torch.nn.Module:
    model = random_qwen2(build_char_tokenizer(), TINY_ARCH, seed=0, dtype=torch.float32)
    if not lora:
        return model
    model = apply_lora(model, LoraAdapterConfig(r=4))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # trained adapters (PEFT starts lora_B at 0, where merging changes nothing)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    return model


def _worker(rank: int, port: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        result = {}
        for lora in (False, True):
            policy = _policy(lora)
            expected = {k: v.clone() for k, v in merged_state_dict(copy.deepcopy(policy)).items()}
            shard_models(policy, None, mesh)
            # what the push loaded before: merged_state_dict of the sharded policy (DTensor shards when not LoRA)
            before = {type(v).__name__ for v in merged_state_dict(policy).values()} if not lora else set()
            state = full_policy_state(policy)
            result[lora] = {"sharded": is_sharded(policy), "before": before, "expected": expected,
                            "types": {k: type(v) for k, v in state.items()},
                            "state": {k: v.clone() for k, v in state.items()}}
        torch.save(result, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp_state")
    forkrun.spawn(_worker, (_free_port(), str(out)), 2)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_full_policy_state_under_fsdp2_is_the_unsharded_merged_state(ranks, lora):
    for rank in ranks:
        got = rank[lora]
        assert got["sharded"]
        expected, state = got["expected"], got["state"]
        assert state.keys() == expected.keys()
        assert all(t is torch.Tensor for t in got["types"].values()), set(got["types"].values())
        for k, v in expected.items():
            assert state[k].shape == v.shape, k
            assert torch.equal(state[k], v), k
    if lora:  # the merged weights are not the base weights: the LoRA delta was gathered and applied
        base = random_qwen2(build_char_tokenizer(), TINY_ARCH, seed=0, dtype=torch.float32).state_dict()
        key = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.equal(ranks[0][lora]["state"][key], base[key])
    else:  # the finding: the sharded policy's own state dict holds DTensor shards
        assert "DTensor" in ranks[0][lora]["before"]
