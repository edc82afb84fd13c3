"""FileCheckpointIO: a checkpoint save costs no second copy of the state in memory, and stays atomic."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import torch
from conftest import compose_train_cfg
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from grpolab.checkpoint.io import FileCheckpointIO


def _save_peak(io, path: Path) -> float:
    """MiB of Python-heap memory a save allocates at its peak (tracemalloc: the serialised bytes of a buffered
    save live there; the tensors' own storage is not counted, so the result is the save's overhead alone)."""
    state = {"state_dict": {f"w{i}": torch.ones(16 << 20) for i in range(4)}}  # 4 x 64 MiB
    tracemalloc.start()
    try:
        io.save_checkpoint(state, path)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_save_does_not_buffer_the_checkpoint_in_memory(tmp_path):
    ours = _save_peak(FileCheckpointIO(), tmp_path / "ours.ckpt")
    lightning = _save_peak(TorchCheckpointIO(), tmp_path / "lightning.ckpt")
    assert ours < 32, f"FileCheckpointIO allocated {ours:.0f} MiB to save a 256 MiB state"
    # Lightning's own save buffers the serialised checkpoint: when this fails, Lightning streams local saves
    # itself and FileCheckpointIO can go
    assert lightning > 200, f"Lightning's save no longer buffers ({lightning:.0f} MiB): drop FileCheckpointIO"
    a, b = torch.load(tmp_path / "ours.ckpt"), torch.load(tmp_path / "lightning.ckpt")
    assert a.keys() == b.keys() and all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


def test_save_is_atomic_and_leaves_no_temporary_file(tmp_path):
    io, path = FileCheckpointIO(), tmp_path / "sub" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.arange(3.0)}, path)
    io.save_checkpoint({"step": 2, "w": torch.arange(4.0)}, f"file://{path}")  # overwrite, file:// URL
    assert torch.equal(io.load_checkpoint(path)["w"], torch.arange(4.0))

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):  # a save that fails midway keeps the old file
        io.save_checkpoint({"step": 3, "bad": Unpicklable()}, path)
    assert io.load_checkpoint(path)["step"] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint({}, path, storage_options={"x": 1})


@pytest.mark.parametrize("trainer", ["cpu", "ddp", "fsdp"])
def test_every_trainer_config_saves_through_it(tmp_path, trainer):
    from hydra.utils import instantiate

    cfg = compose_train_cfg(tmp_path, [f"trainer={trainer}"])
    built = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert isinstance(built.strategy.checkpoint_io, FileCheckpointIO)
