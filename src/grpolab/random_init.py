"""``model.init=random``: a model config's ``config.json`` architecture with random weights, built locally.

For smoke runs and benchmarks at the real shapes (``model=qwen7b model.init=random``): the architecture comes
from the ``model.architecture`` node of ``conf/model/<name>.yaml`` (the public ``config.json`` values), the
weights from transformers' own initialisation under ``seed``; nothing is read from the hub for the weights
(the tokenizer still loads from ``model.tokenizer_path``, else ``model.path``, else ``model.name_or_path``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpolab.errors import ConfigError

if TYPE_CHECKING:
    import torch

INITS = ("pretrained", "random")


def check_init(init: Any, architecture: Any) -> dict[str, Any] | None:
    """Validate ``model.init`` and ``model.architecture`` before any model is built.

    Returns:
        The architecture as a plain dict (None when not given).

    Raises:
        ValueError: naming ``model.init`` when it is not ``pretrained`` or ``random``, or
            ``model.architecture`` when ``init=random`` has none, or it is not a mapping.
    """
    if init not in INITS:
        raise ConfigError(f"model.init must be one of {list(INITS)}, got {init!r}")
    if architecture is None:
        if init == "random":
            raise ConfigError("model.init=random needs model.architecture (the config.json values: hidden_size, "
                              "num_hidden_layers, ...), e.g. from model=qwen0.5b")
        return None
    try:
        arch = {str(k): v for k, v in dict(architecture).items()}
    except (TypeError, ValueError):
        raise ConfigError(f"model.architecture must be a mapping of config.json keys, got {architecture!r}") from None
    return arch


def random_from_architecture(architecture: dict[str, Any], seed: int, dtype: torch.dtype,
                             attn_implementation: str | None = None) -> torch.nn.Module:
    """A causal LM with ``architecture``'s shapes and random weights, the same for the same ``seed``.

    Args:
        architecture: ``config.json`` keys; ``model_type`` picks the transformers class (default ``qwen2``).
        seed: seeds the initialisation in a forked RNG (the caller's torch RNG state is left as it was).
        dtype: parameter dtype (e.g. ``torch.bfloat16``).
        attn_implementation: ``sdpa``, ``eager``, ``flash_attention_2`` or None (transformers' default).

    Returns:
        The model in train mode, on CPU, with ``architecture["vocab_size"]`` embedding rows
        (``tie_word_embeddings`` as given) and its ``generation_config`` derived from the config.
    """
    values = dict(architecture)
    import torch  # here, not at the top: the config checks import this module and must not wait for torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(values.pop("model_type", "qwen2"), **values)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
