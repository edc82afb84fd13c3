"""Build or load the policy, the reference model and the tokenizer.

Three kinds of model config share one interface (``load_tokenizer``, ``load_policy``):

* :class:`PretrainedModel`: a Hugging Face causal LM from a hub id or a local folder (``path``).
* :class:`TinyQwenModel`: a Qwen2-architecture model with small dimensions and random weights that uses a
  real tokenizer from a local folder, so chat-template and BPE code paths run without a download.
* :class:`TinyCharModel`: the embedded default, a ~1M-parameter Qwen2 model with a character-level
  tokenizer, built locally and warm-started with a short supervised run on the task's reference answers
  (cached on disk, keyed by everything that determines it).

Nothing is loaded in a constructor: the Lightning module calls ``load_policy`` in ``configure_model``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    Qwen2Config,
)

from grpolab.char_tokenizer import (
    CHAR_SPECIALS,
    CHAR_VOCAB,
    build_char_tokenizer,
    char_vocab,
    check_covers,
    exported_policy_hint,
    extend_hint,
)
from grpolab.config_checks import check_local_folder
from grpolab.errors import ConfigError
from grpolab.lora import AdapterDisabledReference, LoraAdapterConfig, apply_lora, is_peft
from grpolab.random_init import check_init, random_from_architecture
from grpolab.warmstart import check_patience

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"model.dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def stop_token_ids(tokenizer: Any, model: Any | None = None) -> list[int]:
    """Every id that ends a completion: the tokenizer's eos plus every ``eos_token_id`` of the model's
    generation config (Qwen's instruct models stop on both ``<|im_end|>`` and ``<|endoftext|>``).

    Returns:
        Sorted list of distinct token ids (docs/guide/pitfalls.md #6).

    Raises:
        ValueError: if neither the tokenizer nor the generation config names a stop token.
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is not None:
        ids.update(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]))
    if not ids:
        raise ValueError("model: no stop token: the tokenizer has no eos_token and the generation config none")
    return sorted(ids)


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Put ``model`` in eval mode with gradients off (the frozen reference model)."""
    model.eval()
    model.requires_grad_(False)
    return model


DROPOUT_MODULES = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                   torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Switch every dropout of ``model`` off, in place (TRL's ``disable_dropout_in_model``, extended).

    The sampler's and the reference's log-probs are computed in eval mode and the training forward in train
    mode; with dropout on, the two differ and the lag-0 ratio is not 1 (docs/guide/pitfalls.md #8). This sets ``p = 0`` on
    every ``nn.Dropout``-like module, 0.0 on every float attribute of a module whose name contains
    ``dropout`` (attention implementations read e.g. ``self.attention_dropout`` as a float), and 0.0 on the
    float fields of ``model.config`` named ``*dropout*`` or ``*pdrop`` (GPT-2), so a save/reload keeps it off.

    Returns:
        ``model`` (for chaining).
    """
    for module in model.modules():
        if isinstance(module, DROPOUT_MODULES):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name.lower() and isinstance(value, float):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for name, value in config.to_dict().items():
            if ("dropout" in name.lower() or name.lower().endswith("pdrop")) and isinstance(value, float):
                setattr(config, name, 0.0)
    return model


def make_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``policy``'s current weights, on the same device and dtype; for a LoRA policy the
    same base weights with the adapters disabled (no second copy, :class:`~grpolab.lora.AdapterDisabledReference`)."""
    if is_peft(policy):
        return AdapterDisabledReference(policy)
    return freeze(copy.deepcopy(policy))


class PretrainedModel:
    """A Hugging Face causal LM, from the hub (``name_or_path``) or a local folder (``path``).

    Args:
        name_or_path: hub id such as ``Qwen/Qwen2.5-1.5B-Instruct`` (needs a network) or a folder.
        path: a local Hugging Face folder (for example a run's ``policy/``) that replaces the weights and
            the tokenizer of ``name_or_path``.
        tokenizer_path: a folder to take the tokenizer from instead (default: the weights' folder).
        dtype: ``float32`` | ``bfloat16`` | ``float16`` for the weights.
        gradient_checkpointing: trade compute for activation memory in the policy.
        attn_implementation: passed to ``from_pretrained`` (``sdpa``, ``flash_attention_2``, ``eager``).
        lora: ``model.lora`` (:class:`~grpolab.lora.LoraAdapterConfig`); ``r: null`` = full fine-tuning.
        init: ``pretrained`` | ``random`` (``architecture`` with random weights seeded by ``seed``, no weight
            download: :mod:`grpolab.random_init`). architecture: the ``config.json`` values.
    """

    def __init__(
        self,
        name_or_path: str | None = None,
        path: str | None = None,
        tokenizer_path: str | None = None,
        dtype: str = "bfloat16",
        gradient_checkpointing: bool = False,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        lora: dict | None = None,
        init: str = "pretrained",
        architecture: dict | None = None,
        seed: int = 0,
    ) -> None:
        self.lora = LoraAdapterConfig.from_dict(lora)  # validated before any model is built
        self.init, self.architecture, self.seed = init, check_init(init, architecture), seed
        if init == "random":  # read by the prompt-length default instead of the hub's config.json
            self.arch = self.architecture
        if not (name_or_path or path):
            raise ConfigError("model.name_or_path or model.path must be set")
        check_local_folder("model.path", path, always_local=True)
        check_local_folder("model.tokenizer_path", tokenizer_path)
        check_local_folder("model.name_or_path", name_or_path)
        _dtype(dtype)
        self.name_or_path = name_or_path
        self.path = path
        self.tokenizer_path = tokenizer_path
        self.dtype = dtype
        self.gradient_checkpointing = gradient_checkpointing
        self.attn_implementation = attn_implementation
        self.trust_remote_code = trust_remote_code

    @property
    def source(self) -> str:
        """Where the weights come from: ``path`` if set, else ``name_or_path``."""
        return str(self.path or self.name_or_path)

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        """The tokenizer's eos plus every eos id of the weights' ``generation_config.json`` if present."""
        try:  # init=random: the tokenizer folder's generation config (the weights' folder may be a hub id)
            gen = GenerationConfig.from_pretrained(self.tokenizer_path if self.init == "random" and self.tokenizer_path
                                                   else self.source)
        except (OSError, ValueError):
            gen = None
        holder = type("_Holder", (), {"generation_config": gen})()
        return stop_token_ids(tokenizer, holder)

    def load_tokenizer(self) -> Any:
        """Load the tokenizer (left padding, pad token set to eos when the tokenizer has none)."""
        tok = AutoTokenizer.from_pretrained(self.tokenizer_path or self.source, trust_remote_code=self.trust_remote_code)
        return _prepare_tokenizer(tok)

    def check_text(self, task: Any, tokenizer: Any, splits: dict[str, list[dict]] | None = None) -> None:
        """Refuse data the tokenizer cannot represent, before any step. Nothing to check here: a real tokenizer
        (byte-level BPE, SentencePiece with byte fallback) represents any text; the tiny model's does not."""

    def load_policy(self, task: Any | None = None) -> torch.nn.Module:
        """Load the trainable policy. ``task`` is unused here (the tiny model uses it to warm-start)."""
        if self.init == "random":
            return self._finish(random_from_architecture(self.architecture, self.seed, _dtype(self.dtype),
                                                         self.attn_implementation))
        kwargs: dict[str, Any] = {"dtype": _dtype(self.dtype), "trust_remote_code": self.trust_remote_code}
        if self.attn_implementation:
            kwargs["attn_implementation"] = self.attn_implementation
        model = AutoModelForCausalLM.from_pretrained(self.source, **kwargs)
        return self._finish(model)

    def _finish(self, model: torch.nn.Module) -> torch.nn.Module:
        disable_dropout(model)  # train-mode and eval-mode log-probs must agree (the lag-0 ratio is 1)
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        return apply_lora(model, self.lora)


def _prepare_tokenizer(tok: Any) -> Any:
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def random_qwen2(tokenizer: Any, arch: dict[str, int], seed: int, dtype: torch.dtype) -> torch.nn.Module:
    """A randomly initialised Qwen2 causal LM (tied embeddings) sized for ``tokenizer``, seeded by ``seed``."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, **arch)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(eos_token_id=stop_token_ids(tokenizer),
                                               pad_token_id=tokenizer.pad_token_id)
    return model


class TinyQwenModel(PretrainedModel):
    """Qwen2 architecture, small dimensions, random weights, a real tokenizer from ``tokenizer_path``.

    With ``path`` set it loads that folder instead (like every model config).
    """

    def __init__(
        self,
        tokenizer_path: str,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        intermediate_size: int = 128,
        max_position_embeddings: int = 2048,
        seed: int = 0,
        path: str | None = None,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        lora: dict | None = None,
    ) -> None:
        super().__init__(name_or_path=tokenizer_path, path=path, tokenizer_path=None if path else tokenizer_path,
                         dtype=dtype, gradient_checkpointing=gradient_checkpointing, lora=lora)
        self.arch = dict(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                         num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings)
        self.seed = seed

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        if self.path:
            return super().stop_token_ids(tokenizer)
        return stop_token_ids(tokenizer)

    def load_policy(self, task: Any | None = None) -> torch.nn.Module:
        if self.path:
            return super().load_policy(task)
        return self._finish(random_qwen2(self.load_tokenizer(), self.arch, self.seed, _dtype(self.dtype)))


class TinyCharModel(PretrainedModel):
    """The embedded default: a Qwen2 model of about 1M parameters with a character-level tokenizer.

    Without a warm start it is built from ``seed``. With one, it is built from ``warmstart.seed`` (default 0,
    independent of the run's seed) and trained on the task's training answers until the expected sampled
    accuracy (exact, from teacher-forced probabilities at ``warmstart.temperature``) on held-out training
    prompts reaches ``warmstart.target_accuracy``. The result is cached under ``cache_dir`` keyed by
    :meth:`cache_key` (architecture, vocabulary, warm-start settings, training rows), so every seed of a sweep
    loads the same one.

    The tokenizer (:mod:`grpolab.char_tokenizer`) holds the digits, ``+-*=().,`` and space, then the characters
    of ``extra_chars``; :meth:`check_text` refuses data with any other character before any step.

    Args:
        cache_dir: folder for warm-started models (``${paths.cache_dir}``).
        warmstart: dict of :func:`grpolab.warmstart.warm_start` arguments, or None to skip it.
        path: a local folder to load instead (a run's ``policy/``), skipping the build.
        extra_chars: characters added to the vocabulary (a string, e.g. ``"abc?"``, or a list), after the
            built-in ones, whose ids do not change.

    Raises:
        ConfigError: naming ``model.extra_chars`` when it is not a string or a list of single characters.
    """

    def __init__(
        self,
        hidden_size: int = 128,
        num_hidden_layers: int = 5,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        intermediate_size: int = 384,
        max_position_embeddings: int = 64,
        seed: int = 0,
        cache_dir: str = ".cache/grpolab",
        warmstart: dict | None = None,
        path: str | None = None,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        lora: dict | None = None,
        extra_chars: str | list[str] | None = None,
    ) -> None:
        super().__init__(name_or_path="tiny-char", path=path, dtype=dtype,
                         gradient_checkpointing=gradient_checkpointing, lora=lora)
        self.arch = dict(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                         num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings)
        self.seed, self.cache_dir, self.warmstart = seed, cache_dir, check_patience(dict(warmstart) if warmstart else None)
        self.chars = char_vocab(extra_chars)
        self.extra_chars = self.chars[len(CHAR_VOCAB):]

    def load_tokenizer(self) -> Any:
        return super().load_tokenizer() if self.path else build_char_tokenizer(self.chars)

    def check_text(self, task: Any, tokenizer: Any, splits: dict[str, list[dict]] | None = None) -> None:
        """Refuse a prompt or gold answer with a character the character-level tokenizer cannot represent.

        Args:
            task: the task; its ``splits()`` (train, val, test) unless ``splits`` is given.
            tokenizer: :meth:`load_tokenizer`'s tokenizer.
            splits: ``{split name: rows}`` to check instead (the rows an evaluation samples).

        Raises:
            VocabularyError: naming the split, the row and the character, and ``model.extra_chars``.
        """
        check_covers(task, tokenizer, splits, lambda missing: exported_policy_hint(self.path) if self.path  # its
                     else extend_hint(self.extra_chars, missing))  # vocabulary was fixed by the run that exported it

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        if self.path:
            return super().stop_token_ids(tokenizer)
        return [int(tokenizer.eos_token_id)]

    def _fresh(self, tok: Any) -> torch.nn.Module:
        return random_qwen2(tok, self.arch, self.seed, torch.float32)

    def cache_key(self, task: Any | None) -> str:
        """Hash of everything that determines the warm-started weights: the architecture, the vocabulary, the
        ``warmstart`` settings (with its own ``seed``) and the task's training rows (prompt, answer). The run's
        ``seed`` is not in it: the warm start does not use it."""
        rows = task.splits()["train"] if task is not None else []
        ws = {k: v for k, v in (self.warmstart or {}).items() if k != "patience"}  # a success is the same without it
        # laid out as before warmstart.seed existed (top-level "seed"), so seed-0 entries already cached stay valid
        blob = json.dumps({"arch": self.arch, "seed": int(ws.pop("seed", 0)), "vocab": CHAR_SPECIALS + self.chars,
                           "warmstart": ws or None, "train": [(r["prompt"], r["answer"]) for r in rows]},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def load_policy(self, task: Any | None = None) -> torch.nn.Module:
        if self.path:
            return super().load_policy(task)
        return self._finish(self._build(task))  # dropout off, checkpointing, LoRA

    def _build(self, task: Any | None) -> torch.nn.Module:
        tok = self.load_tokenizer()
        if not self.warmstart:
            return self._fresh(tok)
        if task is None:
            raise ValueError("model.warmstart needs a task: pass the task to load_policy")
        target = Path(self.cache_dir) / "tiny_char" / self.cache_key(task)
        target.parent.mkdir(parents=True, exist_ok=True)
        # one build per key: concurrent jobs (a parallel sweep, test workers) wait for it instead of repeating it
        with FileLock(target.parent / f"{target.name}.lock"):
            if (target / "config.json").exists():
                log.info("tiny model: loading the cached warm start from %s", target)
                return AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
            return self._build_warm_start(tok, task, target)

    def _build_warm_start(self, tok: Any, task: Any, target: Path) -> Any:
        from grpolab.warmstart import warm_start

        ws = {"seed": 0, **self.warmstart}
        model = random_qwen2(tok, self.arch, int(ws["seed"]), torch.float32)
        report = warm_start(model, tok, task.splits()["train"], **ws)
        log.info("tiny model: warm start %s", report)
        tmp = Path(tempfile.mkdtemp(dir=target.parent))
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "warmstart.json").write_text(json.dumps(report, indent=2))
        try:
            os.replace(tmp, target)  # atomic: a concurrent job sees either nothing or a whole folder
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return model

