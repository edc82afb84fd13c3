"""Checks of a composed config and of input files that run before anything is built.

Every error names the config key (``trainer.max_steps``) or the file, so a typo on the command line
(``trainer.max_steps=abc``) stops the run at once with a sentence, not a ``TypeError`` from deep inside
Lightning after the model was built.

- :func:`check_types` walks every config node with a ``_target_`` (data, verifier and its reward
  functions, model, rollout, trainer, callbacks, loggers) and checks each key whose parameter in the
  target's signature has a simple annotation (``int``, ``float``, ``bool``, ``str``, optionally ``None``
  or a union of these); keys of other types are left to the target. ``algo`` is checked by
  :class:`~grpolab.config.GRPOConfig` (its dataclass annotations), ``val`` and ``seed`` here.
- :func:`check_checkpoint` refuses a missing, empty or non-PyTorch ``ckpt_path`` naming the path.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
import zipfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

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
        ValueError: listing every ``<group>.<key>`` whose value has the wrong type, e.g.
            ``trainer.max_steps must be an integer, got 'abc' (str)``.
    """
    errors: list[str] = []
    for key, allowed in (("seed", (int,)),):
        if key in cfg:
            msg = type_error(key, cfg[key], allowed)
            if msg:
                errors.append(msg)
    val = cfg.get("val")
    if val is not None:
        for key, allowed in (("num_generations", (int,)), ("batch_size", (int,)), ("at_start", (bool,))):
            if key in val:
                msg = type_error(f"val.{key}", OmegaConf.select(cfg, f"val.{key}"), allowed)
                if msg:
                    errors.append(msg)
    for group in groups:
        if cfg.get(group) is None:
            continue
        _walk(OmegaConf.to_container(cfg[group], resolve=True), group, errors)
    if errors:
        raise ValueError("invalid config value(s):\n  " + "\n  ".join(errors))


def check_checkpoint(path: str | Path, key: str = "ckpt_path") -> Path:
    """Refuse a checkpoint that is missing, empty or not a PyTorch file, naming the path.

    Returns:
        The path.

    Raises:
        FileNotFoundError: if it does not exist (or is a folder).
        ValueError: if it is empty (e.g. the run was killed while writing it) or not a PyTorch
            checkpoint (neither a zip archive, as ``torch.save`` writes, nor a legacy pickle).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{key}={path}: no such checkpoint file")
    size = p.stat().st_size
    if size == 0:
        raise ValueError(f"{key}={path}: the checkpoint file is empty (0 bytes); it was probably cut off while "
                         "being written. Resume from another checkpoint (e.g. checkpoints/last.ckpt)")
    with p.open("rb") as f:
        head = f.read(2)
    if not zipfile.is_zipfile(p) and head[:1] != b"\x80":
        raise ValueError(f"{key}={path}: not a PyTorch checkpoint ({size} bytes, neither a zip archive nor a "
                         "pickle); it may be truncated or another kind of file")
    return p


def check_resume_steps(path: str | Path, max_steps: Any, key: str = "ckpt_path") -> int:
    """Refuse a resume whose ``trainer.max_steps`` the checkpoint has already reached (it would train nothing).

    The checkpoint is memory-mapped, so only its header is read, not the weights.

    Returns:
        The checkpoint's step (``global_step``, the optimizer steps done).

    Raises:
        ValueError: naming ``trainer.max_steps``, the checkpoint's step and the fix (a larger ``trainer.max_steps``).
    """
    import torch

    try:
        ckpt = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:  # a legacy (non-zip) file cannot be memory-mapped
        ckpt = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=False)
    step = int(ckpt.get("global_step", 0)) if isinstance(ckpt, dict) else 0
    if isinstance(max_steps, int) and max_steps >= 0 and step >= max_steps:
        raise ValueError(f"trainer.max_steps={max_steps} is already reached by {key}={path} (step {step}): nothing "
                         f"to train. To continue the run, resume with trainer.max_steps=<larger than {step}>")
    return step


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
