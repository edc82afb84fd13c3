"""Checks of a composed config and of input files that run before anything is built.

Every error names the config key (``trainer.max_steps``) or the file, so a typo on the command line
(``trainer.max_steps=abc``) stops the run at once with a sentence, not a ``TypeError`` from deep inside
Lightning after the model was built.

- :func:`check_types` walks every config node with a ``_target_`` (data, verifier and its reward
  functions, model, rollout, trainer, callbacks, loggers) and checks each key whose parameter in the
  target's signature has a simple annotation (``int``, ``float``, ``bool``, ``str``, optionally ``None``
  or a union of these); keys of other types are left to the target. ``algo`` is checked by
  :class:`~grpolab.config.GRPOConfig` (its dataclass annotations), ``val`` and ``seed`` here.
- A ``ckpt_path`` is read and checked by :mod:`grpolab.checkpoint.reading`.
- :func:`check_required` refuses a value left ``???`` (``data.path`` of ``data=jsonl``), and :func:`check_paths`
  a ``data.path`` / ``data.test_path`` file or a local ``model.path`` / ``model.name_or_path`` /
  ``model.tokenizer_path`` folder that does not exist (and, offline, a hub id that is not in the local cache).

Every error is a :class:`~grpolab.errors.ConfigError` (a ``ValueError``), which ``src/train.py`` and
``src/eval.py`` print as one line.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpolab.errors import ConfigError, ConfigPathError

_SIMPLE = (int, float, bool, str, type(None))
_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}


def simple_types(annotation: Any) -> tuple[type, ...] | None:
    """The simple types an annotation allows, or ``None`` when it involves anything else (then: no check).

    Examples:
        >>> simple_types(int | None)
        (<class 'int'>, <class 'NoneType'>)
        >>> simple_types(list[int]) is None
        True
    """
    if annotation in _SIMPLE:
        return (annotation,)
    if annotation is None:
        return (type(None),)
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        out: list[type] = []
        for arg in typing.get_args(annotation):
            inner = simple_types(arg)
            if inner is None:
                return None
            out.extend(inner)
        return tuple(dict.fromkeys(out))
    return None


def type_error(key: str, value: Any, allowed: tuple[type, ...]) -> str | None:
    """A message when ``value`` does not fit ``allowed`` (ints count as floats; bools are not numbers).

    Also refuses NaN and infinite floats: no setting of ours means anything at infinity.
    """
    ok = False
    for t in allowed:
        if t is bool:
            ok = ok or isinstance(value, bool)
        elif t is int:
            ok = ok or (isinstance(value, int) and not isinstance(value, bool))
        elif t is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if isinstance(value, float) and not math.isfinite(value):
                    return f"{key} must be a finite number, got {value!r}"
                ok = True
        elif t is type(None):
            ok = ok or value is None
        else:
            ok = ok or isinstance(value, t)
    if ok:
        return None
    return f"{key} must be {' or '.join(_NAMES[t] for t in allowed)}, got {value!r} ({type(value).__name__})"


def _signature_types(target: str) -> dict[str, tuple[type, ...]]:
    from hydra._internal.utils import _locate

    try:
        obj = _locate(target)
    except Exception:  # an unimportable target fails later with Hydra's own message
        return {}
    # A class passing **kwargs up (ArithmeticTask -> Task) takes its base classes' parameters too.
    callables = [c.__init__ for c in obj.__mro__ if "__init__" in vars(c)] if inspect.isclass(obj) else [obj]
    out: dict[str, tuple[type, ...]] = {}
    for fn in callables:
        try:
            sig = inspect.signature(fn, eval_str=True)
        except Exception:
            continue
        for name, param in sig.parameters.items():
            if name in out or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL) or name == "self":
                continue
            allowed = simple_types(param.annotation) if param.annotation is not inspect.Parameter.empty else None
            if allowed is not None:
                out[name] = allowed
        if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            break
    return out


def _walk(node: Any, path: str, errors: list[str]) -> None:
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str):
            allowed = _signature_types(target)
            for key, value in node.items():
                if key in allowed and not isinstance(value, (dict, list)):
                    msg = type_error(f"{path}.{key}", value, allowed[key])
                    if msg:
                        errors.append(msg)
        for key, value in node.items():
            if isinstance(value, dict):
                _walk(value, f"{path}.{key}", errors)


def check_types(cfg: DictConfig, groups: tuple[str, ...] = ("data", "verifier", "model", "rollout", "trainer",
                                                           "callbacks", "logger")) -> None:
    """Type-check the instantiable parts of a composed training config, plus ``val`` and ``seed``.

    Raises:
        ConfigError: listing (``; ``-separated, on one line) every ``<group>.<key>`` whose value has the wrong
            type, e.g. ``trainer.max_steps must be an integer, got 'abc' (str)``.
    """
    errors: list[str] = []
    for key, allowed in (("seed", (int,)),):
        if key in cfg:
            msg = type_error(key, cfg[key], allowed)
            if msg:
                errors.append(msg)
    val = cfg.get("val")
    if val is not None:
        for key, allowed in (("num_generations", (int,)), ("batch_size", (int,)), ("at_start", (bool,)),
                             ("max_prompts", (int, type(None)))):
            if key in val:
                msg = type_error(f"val.{key}", OmegaConf.select(cfg, f"val.{key}"), allowed)
                if msg:
                    errors.append(msg)
    for group in groups:
        if cfg.get(group) is None:
            continue
        _walk(OmegaConf.to_container(cfg[group], resolve=True), group, errors)
    if errors:
        raise ConfigError("; ".join(errors))


FP16_SCALER_MESSAGE = (
    "is not supported: GRPOModule's manual optimization clips and checks the whole step's gradient (algo.max_grad_norm, "
    "the non-finite check, algo.skip_zero_grad_steps) before Lightning's GradScaler unscales it, so it would clip the "
    "scaled gradient and stop at the overflows the scaler is meant to skip. Use trainer.precision=bf16-mixed (GPUs "
    "since Ampere, and CPU), or 32-true")
SCALED_PRECISIONS = ("16-mixed", "16")  # Lightning's fp16 autocast with a GradScaler (16 is its alias)


def check_precision(trainer: Any) -> None:
    """Refuse ``trainer.precision=16-mixed`` (fp16 autocast with loss scaling; see :data:`FP16_SCALER_MESSAGE`).

    Raises:
        ConfigError: naming ``trainer.precision`` and what to use instead.
    """
    precision = trainer.get("precision") if hasattr(trainer, "get") else None
    if str(precision) in SCALED_PRECISIONS:
        raise ConfigError(f"trainer.precision={precision} {FP16_SCALER_MESSAGE}")


def checkpoint_cadence_warning(cfg: DictConfig) -> str | None:
    """The message for ``callbacks.model_checkpoint.every_n_train_steps`` set together with a ``monitor``.

    GRPOModule uses manual optimization; Lightning's ``ModelCheckpoint`` then defers a step's save, without a
    word, until the monitored metric exists, i.e. until the next validation (every ``trainer.val_check_interval``
    steps): a user asking for a checkpoint every N steps gets only ``last.ckpt`` in between. Returns None when the
    settings do what they say.
    """
    every = OmegaConf.select(cfg, "callbacks.model_checkpoint.every_n_train_steps")
    monitor = OmegaConf.select(cfg, "callbacks.model_checkpoint.monitor")
    if not every or monitor is None:
        return None
    return (f"callbacks.model_checkpoint.every_n_train_steps={every} with monitor={monitor!r}: Lightning defers each "
            f"save until {monitor} is logged (the next validation, every trainer.val_check_interval="
            f"{OmegaConf.select(cfg, 'trainer.val_check_interval')} steps). For a checkpoint every {every} steps add "
            "callbacks.model_checkpoint.monitor=null callbacks.model_checkpoint.save_top_k=-1 "
            "callbacks.model_checkpoint.filename='step{step}'; or keep model_checkpoint as it is and set "
            f"callbacks.periodic_checkpoint.every_n_train_steps={every} (a second checkpoint callback, ranked by step)")


def _missing_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """The dotted keys whose value is ``???``, read without resolving any interpolation."""
    out = []
    for key in node.keys():
        child = node._get_node(key)
        if child is None or child._is_interpolation():
            continue
        if child._is_missing():
            out.append(f"{prefix}{key}")
        elif isinstance(child, DictConfig):
            out.extend(_missing_keys(child, f"{prefix}{key}."))
    return out


def check_required(cfg: DictConfig) -> None:
    """Refuse a value left ``???`` (OmegaConf's mandatory marker), e.g. ``data.path`` of ``data=jsonl``.

    Raises:
        ConfigError: naming every such key and how to set it (``data.path=<value>``).
    """
    missing = sorted(k for k in _missing_keys(cfg) if not k.startswith("hydra."))
    if missing:
        keys = " ".join(f"{k}=<value>" for k in missing)
        raise ConfigError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required and not set: add "
                          f"{keys} to the command line")


HUB_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _offline() -> bool:
    import os

    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in HUB_OFFLINE_VARS)


def looks_local(value: str) -> bool:
    """True when a model/tokenizer setting is meant as a local folder: absolute, ``./``, ``../``, ``~`` or an
    existing path (``Qwen/Qwen2.5-0.5B-Instruct`` is a hub id)."""
    return value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists()


def check_local_folder(key: str, value: Any, always_local: bool = False) -> None:
    """Refuse a local folder that does not exist, naming the key, before transformers reads it as a hub id.

    ``value`` is taken as local when ``always_local`` or when :func:`looks_local`; a hub id is left alone.

    Raises:
        ConfigPathError: if the folder does not exist, or is a file.
    """
    if not value:
        return
    text = str(value)
    if not (always_local or looks_local(text)):
        return
    folder = Path(text).expanduser()
    if not folder.exists():
        raise ConfigPathError(f"{key}={text}: the folder does not exist (resolved from the working directory "
                              f"{Path.cwd()}); give an existing Hugging Face model folder")
    if not folder.is_dir():
        raise ConfigPathError(f"{key}={text}: not a folder (give the Hugging Face model folder, not a file)")


def _check_hub_cached(key: str, repo_id: str, filename: str) -> None:
    """Offline (``HF_HUB_OFFLINE=1``): refuse a hub id whose ``filename`` is not in the local cache."""
    if not _offline():
        return
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return
    try:
        found = try_to_load_from_cache(repo_id, filename)
    except Exception:  # an id the hub library refuses to parse: transformers names it later
        return
    if not isinstance(found, str):
        raise ConfigPathError(f"{key}={repo_id}: a hub id, but the hub is offline (HF_HUB_OFFLINE/"
                              "TRANSFORMERS_OFFLINE) and it is not in the local cache; give model.path=<local "
                              "folder>, or download it once with a network")


def check_paths(cfg: DictConfig, data_node: str = "data") -> None:
    """Refuse, before anything is built, the files and folders of the config that do not exist.

    - ``<data_node>.path`` and ``<data_node>.test_path``: a file that does not exist (null = the task's default,
      e.g. the hub);
    - ``model.path`` (always a local folder), ``model.tokenizer_path`` and ``model.name_or_path`` (when
      :func:`looks_local`): a folder that does not exist;
    - offline (``HF_HUB_OFFLINE=1``), a ``model.name_or_path`` hub id that the run needs (no ``model.path``)
      and that is not in the local cache.

    Raises:
        ConfigPathError: naming the key, the value and the fix.
    """
    data = OmegaConf.select(cfg, data_node)
    if isinstance(data, DictConfig):
        for key in ("path", "test_path"):
            value = data.get(key) if key in data and not OmegaConf.is_missing(data, key) else None
            if value and not Path(str(value)).expanduser().is_file():
                what = "a folder, not a file" if Path(str(value)).expanduser().is_dir() else "no such file"
                raise ConfigPathError(f"{data_node}.{key}={value}: {what} (resolved from the working directory "
                                      f"{Path.cwd()}); give a .jsonl/.json/.parquet file"
                                      + ("" if key == "path" and data.get("hub_id") is None else
                                         f", or {data_node}.{key}=null"))
    model = cfg.get("model")
    if not isinstance(model, DictConfig):
        return
    path, name, tok = model.get("path"), model.get("name_or_path"), model.get("tokenizer_path")
    check_local_folder("model.path", path, always_local=True)
    check_local_folder("model.tokenizer_path", tok)
    check_local_folder("model.name_or_path", name)
    if name and not path and not looks_local(str(name)):
        random = model.get("init") == "random"
        if not (random and tok):  # init=random reads only the tokenizer from name_or_path
            _check_hub_cached("model.name_or_path", str(name), "tokenizer_config.json" if random else "config.json")
