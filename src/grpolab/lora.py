"""LoRA through PEFT: settings (``model.lora``), wrapping the policy, the adapter-disabled reference model,
parameter counts, the merged weights a sampler engine loads, and the merged export.

With LoRA the reference model of the KL term (``algo.beta > 0``) is the SAME base weights with the adapters
switched off (PEFT's ``disable_adapter``), so it costs no second copy of the model (as in TRL).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from grpolab.errors import ConfigError

log = logging.getLogger(__name__)

# Qwen2/Llama projection names: every linear layer of attention and MLP (lm_head/embeddings excluded).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraAdapterConfig:
    """``model.lora``: LoRA adapters on the policy (PEFT ``LoraConfig``); ``r = None`` = full fine-tuning.

    Attributes:
        r: adapter rank (int >= 1) or None.
        alpha: ``lora_alpha`` (> 0); the update is scaled by ``alpha / r``.
        dropout: ``lora_dropout`` in [0, 1). Keep 0 for exact on-policy ratios: with dropout the training
            forward differs from the sampler's (docs/guide/pitfalls.md #8).
        target_modules: module names (last name component, e.g. ``q_proj``) or ``"all-linear"``.

    Raises:
        ValueError: naming ``model.lora.<key>`` for an invalid value.
    """

    r: int | None = None
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Any = DEFAULT_TARGET_MODULES

    def __post_init__(self) -> None:
        if self.r is not None and not (isinstance(self.r, int) and not isinstance(self.r, bool) and self.r >= 1):
            raise ConfigError(f"model.lora.r must be null (full fine-tuning) or an int >= 1, got {self.r!r}")
        if not (isinstance(self.alpha, int | float) and self.alpha > 0):
            raise ConfigError(f"model.lora.alpha must be a number > 0, got {self.alpha!r}")
        if not (isinstance(self.dropout, int | float) and 0 <= self.dropout < 1):
            raise ConfigError(f"model.lora.dropout must be in [0, 1), got {self.dropout!r}")
        tm = self.target_modules
        if isinstance(tm, str):
            if tm != "all-linear":
                raise ConfigError(f"model.lora.target_modules must be a list of module names or 'all-linear', got {tm!r}")
        else:
            tm = list(tm or [])
            if not tm or not all(isinstance(t, str) and t for t in tm):
                raise ConfigError(f"model.lora.target_modules must be a non-empty list of module names, got {tm!r}")
            self.target_modules = tm

    @classmethod
    def from_dict(cls, values: Any) -> LoraAdapterConfig:
        """From ``model.lora`` (a dict/DictConfig, or None for full fine-tuning); unknown keys raise."""
        if values is None:
            return cls()
        values = dict(values)
        unknown = sorted(set(values) - {"r", "alpha", "dropout", "target_modules"})
        if unknown:
            raise ConfigError(f"model.lora: unknown key(s) {unknown}; known: r, alpha, dropout, target_modules")
        if "target_modules" in values and not isinstance(values["target_modules"], str | None):
            values["target_modules"] = list(values["target_modules"])
        return cls(**values)

    @property
    def enabled(self) -> bool:
        return self.r is not None


def validate_lora(values: Any, ref_refresh_every: int | None = None) -> LoraAdapterConfig:
    """Check ``model.lora`` (and its combination with ``algo.ref_refresh_every``) before any model is built.

    Raises:
        ValueError: naming the key at fault.
    """
    settings = LoraAdapterConfig.from_dict(values)
    if settings.enabled and ref_refresh_every:
        raise ConfigError(f"algo.ref_refresh_every={ref_refresh_every} cannot be used with model.lora.r={settings.r}: "
                          "the LoRA reference model is the base weights with the adapters disabled; set "
                          "algo.ref_refresh_every=null, or model.lora.r=null (full fine-tuning)")
    return settings


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Distinct last-component names of the ``nn.Linear`` modules of ``model`` (candidate LoRA targets)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def apply_lora(model: torch.nn.Module, settings: LoraAdapterConfig) -> torch.nn.Module:
    """Wrap ``model`` in a PEFT LoRA model (base weights frozen); returns ``model`` unchanged when disabled.

    With ``settings.dropout > 0`` it logs one warning per wrapped model: PEFT's ``lora_dropout`` modules are added
    here, after :func:`~grpolab.models.disable_dropout`, so they stay active in train mode.

    Raises:
        ValueError: naming ``model.lora.target_modules`` and listing the model's linear module names when a
            target names no module.
    """
    if not settings.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    if settings.target_modules != "all-linear":
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [t for t in settings.target_modules if t not in names]
        if missing:
            raise ConfigError(f"model.lora.target_modules {missing} name no module of this model; its linear "
                              f"modules are {linear_module_names(model)}")
    if settings.dropout > 0:  # applied after disable_dropout, so PEFT's lora_dropout stays on in train mode
        log.warning("model.lora.dropout=%s > 0: the LoRA dropout is active in the training forward (train mode) but "
                    "not in the sampler's and the reference's eval-mode passes, so the lag-0 importance ratio is not "
                    "1 and the clip statistics measure dropout noise; set model.lora.dropout=0 for exact on-policy "
                    "ratios", settings.dropout)
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=settings.target_modules, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    counts = count_parameters(peft_model)
    log.info("LoRA r=%d on %s: %d of %d parameters trainable", settings.r, settings.target_modules,
             counts["num_trainable_params"], counts["num_params"])
    return peft_model


def is_peft(model: Any) -> bool:
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


class AdapterDisabledReference(torch.nn.Module):
    """The frozen reference model as the policy's base weights with the LoRA adapters disabled.

    It owns no parameters (the policy is held outside the module tree, so checkpoints and DDP see it once);
    every forward runs the policy in eval mode, without grad, inside ``disable_adapter()``. It has the call
    interface the rollout code uses for a reference model (``model(**inputs)``, ``parameters()``, ``eval()``).
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        if not is_peft(policy):
            raise TypeError("AdapterDisabledReference needs a PEFT model (model.lora.r set)")
        object.__setattr__(self, "_policy", policy)  # not a submodule: no duplicate weights in state_dict

    def parameters(self, recurse: bool = True):  # noqa: D102 - device/dtype lookups by the rollout code
        return self._policy.parameters(recurse)

    @property
    def config(self) -> Any:
        """The policy's model config (the log-prob passes pick the same forward path as for the policy)."""
        return self._policy.config

    @torch.no_grad()
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        was_training = self._policy.training
        self._policy.eval()  # no dropout in the reference
        try:
            with self._policy.disable_adapter():
                return self._policy(*args, **kwargs)
        finally:
            self._policy.train(was_training)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the LoRA reference is the base model; algo.ref_refresh_every is not supported "
                                  "with model.lora.r")


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's checkpoint names, LoRA deltas merged in; ``model`` is untouched.

    For a plain model this is ``model.state_dict()``. For a PEFT LoRA model every adapted linear layer's
    ``weight`` is ``base_layer.weight + get_delta_weight(adapter)`` (PEFT's own delta: ``alpha / r`` * B A,
    transposed for ``fan_in_fan_out``), the adapter tensors are dropped and ``.base_layer`` leaves the names:
    the same tensors, bit for bit, as ``merge_and_unload()`` gives, without merging in place. TRL instead merges,
    pushes and unmerges the live model (``merge_adapter``/``unmerge_adapter``), which rounds the base weights a
    little at every sync; here the trainer's weights never change.

    Returns:
        name -> tensor, the keys of the base model's ``state_dict`` (e.g. ``model.layers.0.self_attn.q_proj.weight``),
        dtypes and devices of the policy. Merged weights are new tensors; the others are the policy's own
        (detached), so a caller that keeps them must copy them.

    Raises:
        NotImplementedError: for a PEFT model with more than one active adapter.
    """
    if not is_peft(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    state = {k: v.detach() for k, v in base.state_dict().items() if ".lora_" not in k}
    with torch.no_grad():
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer) or not module.active_adapters:
                continue
            if len(module.active_adapters) != 1:
                raise NotImplementedError(f"{name}: {len(module.active_adapters)} active LoRA adapters; one is "
                                          "supported")
            key = f"{name}.base_layer.weight"
            state[key] = state[key] + module.get_delta_weight(module.active_adapters[0]).to(state[key].dtype)
    return {k.replace(".base_layer.", "."): v for k, v in state.items()}


def full_policy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """:func:`merged_state_dict` with full tensors under every trainer: what a sampler engine's weight push loads.

    For a plain or DDP policy it is :func:`merged_state_dict`. For an FSDP2 (``trainer=fsdp``) policy, whose
    parameters are DTensor shards, every tensor is all-gathered by
    :func:`~grpolab.distributed.iter_full_parameters` (one module at a time), and a LoRA delta is PEFT's own
    ``get_delta_weight`` evaluated on the gathered ``lora_A`` / ``lora_B``, so the result equals, bit for bit,
    :func:`merged_state_dict` of the same model unsharded. Under FSDP2 this is a collective: call it on every rank.

    Args:
        model: the policy (plain, DDP-wrapped, FSDP2-sharded; PEFT LoRA or not).

    Returns:
        name -> plain ``torch.Tensor`` (never a DTensor), the base model's checkpoint names and full shapes, on
        the policy's device. Gathered tensors are copies; unsharded ones are the policy's own (detached).

    Raises:
        NotImplementedError: more than one active adapter, or (sharded) a LoRA layer that is not a linear layer.
    """
    from grpolab.distributed import is_sharded, iter_full_parameters, unwrap

    if not is_sharded(model):
        return merged_state_dict(unwrap(model))
    base = model.get_base_model() if is_peft(model) else unwrap(model)
    full = dict(iter_full_parameters(base, include_buffers=True))
    first: dict[int, str] = {}  # a tied tensor is gathered once, under its first name
    for name, t in [*base.named_parameters(remove_duplicate=False), *base.named_buffers(remove_duplicate=False)]:
        first.setdefault(id(t), name)
        if name not in full:
            full[name] = full[first[id(t)]]
    state = {k: full[k] for k in base.state_dict() if ".lora_" not in k}  # no gather: names only
    if not is_peft(model):
        return state
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or not module.active_adapters:
            continue
        if len(module.active_adapters) != 1 or not isinstance(module, LoraLinear):
            raise NotImplementedError(f"{name}: merging a sharded LoRA layer needs one active adapter on a linear "
                                      f"layer ({type(module).__name__}, {len(module.active_adapters)} active)")
        adapter = module.active_adapters[0]
        # PEFT's delta (transpose(B @ A) * scaling) read from a stand-in holding the gathered adapter weights
        gathered = SimpleNamespace(
            lora_A={adapter: SimpleNamespace(weight=full[f"{name}.lora_A.{adapter}.weight"])},
            lora_B={adapter: SimpleNamespace(weight=full[f"{name}.lora_B.{adapter}.weight"])},
            fan_in_fan_out=module.fan_in_fan_out, scaling=module.scaling)
        key = f"{name}.base_layer.weight"
        state[key] = state[key] + LoraLinear.get_delta_weight(gathered, adapter).to(state[key].dtype)
    return {k.replace(".base_layer.", "."): v for k, v in state.items()}


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """``num_params`` (all distinct parameters, adapters included) and ``num_trainable_params``."""
    params = {id(p): p for p in model.parameters()}.values()
    return {"num_params": int(sum(p.numel() for p in params)),
            "num_trainable_params": int(sum(p.numel() for p in params if p.requires_grad))}


def save_policy(policy: torch.nn.Module, tokenizer: Any, folder: Path, write: bool = True) -> None:
    """Write the policy to ``folder`` so that ``AutoModelForCausalLM.from_pretrained(folder)`` loads it.

    A LoRA policy is exported MERGED (base + ``alpha / r`` * B A), and its adapter is saved beside it in
    ``folder/adapter`` (``PeftModel.from_pretrained(base, folder / "adapter")``). Merging happens in place:
    afterwards ``policy`` computes the same function through the merged weights. An FSDP2-sharded policy is
    gathered first: call this on EVERY rank (a collective), with ``write`` true on rank 0 only.
    """
    from grpolab.distributed import full_state_dict, is_sharded

    folder = Path(folder)
    if is_sharded(policy):
        if is_peft(policy):  # rejected before training by grpolab.distributed.check_trainer
            raise NotImplementedError("exporting a LoRA policy trained with trainer=fsdp is not supported")
        state = full_state_dict(policy)
        if write:
            policy.save_pretrained(folder, state_dict=state)
            tokenizer.save_pretrained(folder)
        return
    if not write:
        return
    if is_peft(policy):
        policy.save_pretrained(folder / "adapter")
        merged = policy.merge_and_unload()
        merged.save_pretrained(folder)
    else:
        policy.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
