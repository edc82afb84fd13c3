"""Checkpoints without the weights that never change: the frozen reference model and a LoRA policy's base.

A training checkpoint has to hold what the run changed (trainable weights, optimizer, buffer, RNG); the frozen
tensors are rebuilt from the model config at resume exactly as the run built them, so saving them only costs
disk and save time: a full fine-tuning run with ``beta > 0`` saved the reference beside the policy (half the
weights of each checkpoint), and a LoRA run at Qwen2.5-1.5B saved 2.9 GiB of base weights beside a few MiB of
adapters. TRL and verl do not save the reference either.

What is left out is recorded in the checkpoint (the keys and a hash of their bytes per top-level module,
``policy`` / ``reference``). A resume or ``src/eval.py ckpt_path=...`` rebuilds the model, checks the hash of
the rebuilt frozen tensors against the recorded one and puts them back into the loaded state dict, so the load
stays strict; a model built differently (another ``model.path``, ``model.seed`` or warm start) is refused with
:class:`FrozenWeightsMismatch` instead of resuming against other weights. Checkpoints written before this (with
every key) load unchanged.

What a resumed run leaves out follows its own settings: a resume that turns ``algo.ref_refresh_every`` on keeps the
(now moving) reference, and a frozen tensor the checkpoint held with other values than the rebuilt one (a reference
an earlier refresh moved, resumed with ``ref_refresh_every`` off) stays in later checkpoints (:func:`moved_keys`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, MutableMapping

import torch

from grpolab.errors import ConfigError

#: where the record of the left-out keys goes in a Lightning checkpoint (under ``checkpoint["grpolab"]``)
RECORD_KEY = "frozen_weights"


class FrozenWeightsMismatch(ConfigError):
    """The frozen weights a checkpoint left out differ from the ones the current config builds."""


def frozen_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The keys of ``state`` whose value is a parameter that takes no gradient, sorted.

    Args:
        state: a module's ``state_dict(keep_vars=True)`` (parameters as ``nn.Parameter``; buffers, which are
            never left out, as plain tensors). Tied parameters appear under each of their keys.
    """
    return sorted(k for k, v in state.items() if isinstance(v, torch.nn.Parameter) and not v.requires_grad)


def fingerprint(state: Mapping[str, torch.Tensor], keys: Iterable[str]) -> str:
    """A SHA-256 hash (its first 32 hex digits) of ``keys``' names, dtypes, shapes and bytes in ``state``, in the
    given order.

    One pass over the bytes, no copy on CPU (a GPU tensor is copied to the host one at a time): 1.4 GB/s on this
    project's CPU (SHA instructions; BLAKE2b ran at 0.66), so 4 s for a 1.5B fp32 base, once at the first save
    and once at resume.

    Raises:
        KeyError: a key that ``state`` does not hold.
    """
    h = hashlib.sha256()
    for key in keys:
        t = state[key].detach()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).contiguous().cpu().view(torch.uint8).numpy().data)
    return h.hexdigest()[:32]


def _groups(keys: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in keys:
        out.setdefault(key.split(".", 1)[0], []).append(key)
    return out


def describe(state: Mapping[str, torch.Tensor], keys: list[str]) -> dict:
    """The record of ``keys`` left out of a checkpoint: ``{"keys": [...], "fingerprints": {group: hash}}``, one
    hash per top-level name (``policy``, ``reference``) so that a reader of one group can check it alone."""
    return {"keys": list(keys), "fingerprints": {g: fingerprint(state, ks) for g, ks in _groups(keys).items()}}


def moved_keys(checkpoint_state: Mapping[str, torch.Tensor], module_state: Mapping[str, torch.Tensor],
               record: dict | None) -> set[str]:
    """The frozen keys a checkpoint held (not left out by its ``record``) with other values than the rebuilt
    module's: a reference that ``algo.ref_refresh_every`` moved before the resume. Later checkpoints must keep
    them, since a rebuild from the config would not give them back (one comparison per tensor, at resume).

    Args:
        checkpoint_state: the checkpoint's ``state_dict`` (any device).
        module_state: the rebuilt module's ``state_dict(keep_vars=True)``, with the checkpoint's key names.
        record: the checkpoint's record (:func:`describe`), or None when it left nothing out.
    """
    left_out = set((record or {}).get("keys", []))
    moved = set()
    for key in frozen_keys(module_state):
        if key in left_out or key not in checkpoint_state:
            continue
        built = module_state[key].detach()
        if not torch.equal(checkpoint_state[key].to(built.device), built):
            moved.add(key)
    return moved


def strip(checkpoint_state: MutableMapping[str, torch.Tensor], record: dict) -> None:
    """Remove the record's keys from a checkpoint's ``state_dict`` (in place)."""
    for key in record["keys"]:
        checkpoint_state.pop(key, None)


def restore(checkpoint_state: MutableMapping[str, torch.Tensor], module_state: Mapping[str, torch.Tensor],
            record: dict, source: str, groups: Iterable[str] | None = None) -> int:
    """Put the frozen tensors a checkpoint left out back into its ``state_dict``, from the rebuilt module.

    Args:
        checkpoint_state: the checkpoint's ``state_dict``, completed in place.
        module_state: the rebuilt module's ``state_dict(keep_vars=True)``, with the checkpoint's key names.
        record: the checkpoint's record (:func:`describe`).
        source: the checkpoint's path, for the error message.
        groups: the top-level names to restore and check (default: every group of the record).

    Returns:
        the number of keys put back.

    Raises:
        FrozenWeightsMismatch: the rebuilt module lacks a recorded key, or its frozen tensors hash differently
            from the ones the checkpoint was saved with.
    """
    by_group = _groups(record["keys"])
    restored = 0
    for group in (by_group if groups is None else [g for g in groups if g in by_group]):
        keys = by_group[group]
        missing = [k for k in keys if k not in module_state]
        if missing:
            raise FrozenWeightsMismatch(
                f"{source}: the checkpoint left out {len(keys)} frozen '{group}' tensors that the model built now "
                f"does not have (first: {missing[0]}); give the same model overrides (model.lora.r, experiment, ...) as the "
                "run that saved it")
        if fingerprint(module_state, keys) != record["fingerprints"][group]:
            raise FrozenWeightsMismatch(
                f"{source}: the frozen '{group}' weights built now (the reference model or a LoRA base, rebuilt "
                "from the model config) differ from the ones this checkpoint was saved with; give the same model.path / "
                "model.seed / model.dtype / warm start as the run that saved it")
        for key in keys:
            checkpoint_state[key] = module_state[key].detach()
        restored += len(keys)
    return restored


def restore_policy(checkpoint: MutableMapping, policy: torch.nn.Module, source: str) -> int:
    """:func:`restore` for a reader of the ``policy.`` weights alone (``src/eval.py ckpt_path=...``): put a
    Lightning checkpoint's left-out frozen policy tensors (a LoRA base) back from ``policy``, the rebuilt model.
    Returns the number of keys put back (0 for a checkpoint that left nothing out).

    Raises:
        FrozenWeightsMismatch: as :func:`restore`.
    """
    record = (checkpoint.get("grpolab") or {}).get(RECORD_KEY)
    if not record:
        return 0
    module_state = {f"policy.{k}": v for k, v in policy.state_dict(keep_vars=True).items()}
    return restore(checkpoint["state_dict"], module_state, record, source, groups=["policy"])


class CheckpointPlan:
    """What one module's checkpoints leave out, kept across saves and resumes (``GRPOModule`` holds one).

    Args:
        ref_moving: ``algo.ref_refresh_every`` is set, so the reference moves and is always kept.

    Attributes:
        record: the :func:`describe` record of the keys left out (computed once, at the first save: frozen tensors do
            not change), {} to keep every key, None until computed.
        moved: frozen keys a resumed checkpoint held with other values than the rebuilt ones (a reference an earlier
            ``ref_refresh_every`` moved): kept in later checkpoints, since a rebuild would put the initial one back.
    """

    def __init__(self, ref_moving: bool) -> None:
        self.ref_moving = ref_moving
        self.record: dict | None = None
        self.moved: set[str] = set()

    def keys(self, module_state: Mapping[str, torch.Tensor]) -> list[str]:
        """The keys checkpoints leave out under today's settings (not a moving or moved reference)."""
        return [k for k in frozen_keys(module_state) if k not in self.moved
                and not (self.ref_moving and k.startswith("reference."))]

    def for_save(self, module_state: Mapping[str, torch.Tensor]) -> dict:
        """The record to strip a checkpoint with (:func:`strip`); {} keeps every key."""
        if self.record is None:
            keys = self.keys(module_state)
            self.record = describe(module_state, keys) if keys else {}
        return self.record

    def after_load(self, checkpoint_state: MutableMapping[str, torch.Tensor],
                   module_state: Mapping[str, torch.Tensor], saved: dict | None, source: str) -> None:
        """Put the frozen tensors a checkpoint left out back into ``checkpoint_state`` (checked by hash, so the
        load stays strict), and plan the next saves from today's settings: a resume that turns on
        ``ref_refresh_every`` keeps the now-moving reference; the saved hashes are reused when the keys agree.

        Raises:
            FrozenWeightsMismatch: the rebuilt frozen weights are not the checkpoint's (:func:`restore`).
        """
        if saved:
            restore(checkpoint_state, module_state, saved, source)
        self.moved = moved_keys(checkpoint_state, module_state, saved)
        self.record = saved if saved and set(saved["keys"]) == set(self.keys(module_state)) else None
