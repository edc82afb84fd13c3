"""How ``src/train.py`` and ``src/eval.py`` report a user error: one line on stderr, no traceback, exit status 2.

A user error is a :class:`~grpolab.errors.ConfigError` (a wrong value or type, a missing required key, file or
folder, settings that conflict), also when Hydra's ``instantiate`` wraps it in an ``InstantiationException``,
and an override of a key the composed config does not have (``algo.epsilonn=0.3``), which
:func:`check_overrides` finds before Hydra composes the run and answers with the closest existing keys. Any
other exception is a crash and keeps its traceback.

``GRPOLAB_TRACEBACK=1`` (or Hydra's own ``HYDRA_FULL_ERROR=1``) brings the traceback back for user errors too.

Light on purpose (Hydra and OmegaConf only): the entry points run these checks before importing torch.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpolab.errors import ConfigError

TRACEBACK_VARS = ("GRPOLAB_TRACEBACK", "HYDRA_FULL_ERROR")
EXIT_USER_ERROR = 2  # as argparse


def skip_the_exit_collection() -> None:
    """At interpreter exit, after every other ``atexit`` handler (registered first, it runs last), move every object
    into the collector's permanent generation (:func:`gc.freeze`): the exit's collections then skip the millions of
    objects torch, transformers and Lightning imported: about 1 s of CPU per process, 0.86x a plain exit of a process
    holding that stack (``benchmarks/exit_collection.py``, side by side). Nothing is skipped but that walk: the handlers (loggers, W&B, process pools,
    temporary folders) have run, the files are closed, and the memory goes back with the process."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def wants_traceback() -> bool:
    """True when ``GRPOLAB_TRACEBACK`` or ``HYDRA_FULL_ERROR`` is set to 1/true/yes/on."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in TRACEBACK_VARS)


def user_error(exc: BaseException | None) -> ConfigError | None:
    """The :class:`ConfigError` behind ``exc``: itself, or the cause of (nested) Hydra ``InstantiationException``
    wrappers; None for anything else (a crash)."""
    from hydra.errors import InstantiationException

    for _ in range(8):
        if isinstance(exc, ConfigError):
            return exc
        if not isinstance(exc, InstantiationException):
            return None
        exc = exc.__cause__
    return None


def one_line(message: str) -> str:
    """``message`` on one line: ``"header:\\n  a\\n  b"`` becomes ``"header: a; b"``."""
    text = re.sub(r":[ \t]*\n\s*", ": ", message.strip())
    return re.sub(r"\s*\n\s*", "; ", text)


def fail(prog: str, message: str) -> None:
    """Print ``<prog>: error: <message>`` (one line) on stderr and exit with status 2.

    Raises:
        SystemExit: always.
    """
    sys.stdout.flush()
    sys.stderr.write(f"{prog}: error: {one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_USER_ERROR)


@contextlib.contextmanager
def report_user_errors(prog: str) -> Iterator[None]:
    """Around a Hydra task function's body: a user error (see :func:`user_error`) ends the process with one
    line and status 2 (:func:`fail`), unless :func:`wants_traceback`; everything else propagates unchanged.

    Raises:
        SystemExit: for a user error.
    """
    try:
        yield
    except Exception as ex:
        err = user_error(ex)
        if err is None or wants_traceback():
            raise
        discard_empty_run_folder()  # a run refused before it did anything leaves no folder behind
        fail(prog, str(err))


def discard_empty_run_folder() -> Path | None:
    """Remove a single run's Hydra run folder when the run left nothing in it: Hydra's ``.hydra/`` and an empty
    ``<job>.log`` only (``+plan_only=true``, which prints the plan; a run refused by a config error, whose message is
    on stderr). A folder holding anything else (a log line, a checkpoint, a file of the user's) is kept, and so are
    multirun job folders (a failed job writes ``error.txt`` there). The log file's handler is closed first, and the
    parent folders the removal leaves empty below the working directory (``outputs/train/``) go too.

    Returns:
        The removed folder, or None.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN:
        return None
    out = Path(HydraConfig.get().runtime.output_dir)
    if not out.is_dir() or any(not ((e.name == ".hydra" and e.is_dir()) or (e.suffix == ".log" and e.is_file()
                                                                          and e.stat().st_size == 0))
                               for e in out.iterdir()):
        return None
    for handler in list(logging.root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == out:
            handler.close()
            logging.root.removeHandler(handler)
    shutil.rmtree(out, ignore_errors=True)
    cwd, parent = Path.cwd().resolve(), out.resolve().parent
    while cwd in parent.parents:  # outputs/train/ left empty under the working directory goes too
        try:
            parent.rmdir()
        except OSError:  # not empty
            break
        parent = parent.parent
    return out


# ------------------------------------------------------------------------------- overrides of unknown keys
def closest_keys(cfg: DictConfig, key: str, n: int = 3) -> list[str]:
    """The existing keys closest to ``key``: its first segment that does not exist is matched (difflib) against
    the keys of the node above it, and the rest of ``key`` kept where it exists below the match.

    Examples: ``algo.epsilonn`` -> ``algo.epsilon``; ``algoo.epsilon`` -> ``algo.epsilon``.
    """
    parts = key.split(".")
    node: object = cfg
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            return []
        if part in node:
            node = node._get_node(part)
            continue
        prefix = ".".join(parts[:i])
        out = []
        for match in difflib.get_close_matches(part, [str(k) for k in node.keys()], n=n):
            full = ".".join(p for p in (prefix, match) if p)
            rest = ".".join(parts[i + 1:])
            if rest and OmegaConf.select(node, f"{match}.{rest}", default="<none>",
                                         throw_on_resolution_failure=False) != "<none>":
                full = f"{full}.{rest}"
            out.append(full)
        return out
    return []


def unknown_key_message(cfg: DictConfig, key: str, line: str, config_dir: str | Path | None = None) -> str:
    """The sentence for an override ``line`` of a ``key`` that ``cfg`` (composed without it) does not have: a key of a
    config group option the run did not choose (``rollout.refresh.drift.max_drift`` without ``rollout/refresh=drift``)
    names how to choose it; else the closest existing keys."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        group, option = "/".join(parts[:i]), parts[i]
        chosen = OmegaConf.select(cfg, ".".join(parts[:i + 1]), default=None, throw_on_resolution_failure=False)
        if config_dir is not None and chosen is None and (Path(config_dir) / group / f"{option}.yaml").is_file():
            return (f"{key}: {'.'.join(parts[:i + 1])} is the option {option} of the config group {group}, which the run "
                    f"did not choose: choose it with {group}={option} (or '{group}=[...,{option}]' beside others where "
                    f"the group takes a list, as rollout/refresh), then set its keys")
    close = closest_keys(cfg, key)
    if close:
        return f"{key} is not a key of the config; did you mean {' or '.join(close)}?"
    return (f"{key} is not a key of the config and no existing key is close to it (`--cfg job` lists them); "
            f"to add a new key write +{line}")


def _single_value_line(override: Any) -> str | None:
    """The override as a command-line item with one value: a sweep (``seed=0,1``) takes its first value;
    None when it cannot be reduced to one (e.g. ``interval(0,1)``): that item is left out of the check."""
    if not override.is_sweep_override():
        return override.input_line
    try:
        first = next(iter(override.sweep_string_iterator()))
    except Exception:
        return None
    prefix = "++" if override.is_force_add() else "+" if override.is_add() else ""
    return f"{prefix}{override.get_key_element()}={first}"


def unknown_overrides(config_dir: str | Path, config_name: str, argv: list[str]) -> list[str]:
    """Messages for the command-line overrides of keys the composed config does not have, one per key.

    The overrides are composed with Hydra's Compose API as ``hydra.main`` would compose them (a multirun's
    sweeps with their first value). Whenever Hydra refuses an override because its key does not exist, the
    item is set aside and the rest composed again; each set-aside key gets :func:`unknown_key_message`
    against the config composed without it. A config group option that does not exist gets
    :func:`missing_option_message`. Anything else Hydra refuses (a sweep without ``-m``, ...) is left to Hydra's own
    message (an empty list).
    """
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, MissingConfigException

    args, _ = get_args_parser().parse_known_args(argv)
    if (args.help or args.hydra_help or args.info or args.shell_completion or args.config_path or args.config_dir
            or getattr(args, "experimental_rerun", None)):
        return []
    parsed = OverridesParser.create().parse_overrides(args.overrides)
    if any(o.is_sweep_override() for o in parsed) and not args.multirun:
        return []  # Hydra: "Ambiguous value ... use --multirun"
    items = [(o, line) for o in parsed if (line := _single_value_line(o)) is not None]
    found: list[tuple[str, str]] = []
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        for _ in range(len(items) + 1):
            try:
                cfg = compose(config_name=args.config_name or config_name, overrides=[line for _, line in items],
                              return_hydra_config=True)
                break
            except MissingConfigException as ex:  # a config group option that does not exist: one line too
                return [missing_option_message(ex)] if ex.options and ex.missing_cfg_file else []
            except ConfigCompositionException as ex:
                m = re.match(r"Could not override '([^']+)'", str(ex))
                at = [i for i, (o, _) in enumerate(items) if m and o.key_or_group == m.group(1)]
                if not at:
                    return []
                found.append((m.group(1), items[at[0]][0].input_line))
                del items[at[0]]
        else:
            return []
    return [unknown_key_message(cfg, key, line, config_dir) for key, line in found]


def missing_option_message(ex: Any) -> str:
    """One line for Hydra's ``MissingConfigException`` of a group option: ``algo=grpo_offpolic is not an option of
    algo; the options: ...; did you mean grpo_offpolicy?`` (``ex.missing_cfg_file`` is ``<group>/<option>``)."""
    group, _, option = str(ex.missing_cfg_file).rpartition("/")
    close = difflib.get_close_matches(option, ex.options, n=1)
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    return f"{group}={option} is not an option of {group}; the options: {', '.join(ex.options)}{hint}"


def check_overrides(config_dir: str | Path, config_name: str, prog: str, argv: list[str] | None = None) -> None:
    """Before ``hydra.main``: refuse a command line that overrides a key the config does not have, in one line
    that names the key and the closest existing ones (:func:`unknown_overrides`), exit status 2.

    Skipped when :func:`wants_traceback` (Hydra then reports as it always does) and, so that it can never stop a
    good command line, when the check itself fails for any other reason.

    Raises:
        SystemExit: for an override of a key that does not exist.
    """
    if wants_traceback():
        return
    try:
        problems = unknown_overrides(config_dir, config_name, sys.argv[1:] if argv is None else argv)
    except Exception:  # the check must never stop a command line Hydra would run: Hydra decides
        return
    if problems:
        fail(prog, "; ".join(problems))


def in_multirun() -> bool:
    """True inside a job of a Hydra multirun (``-m``): the one place the application asks."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


# ------------------------------------------------------------------------------- the command that continues a run
def resume_command(ckpt_path: str | Path | None, script: str | None = None) -> str:
    """The shell command that continues this run: ``python <script> <the run's own overrides> ckpt_path=<path>``.

    The overrides are the ones this job was composed with (Hydra's ``overrides.task``: in a multirun, the job's
    own values), as typed, so settings such as ``trainer.max_steps=2000`` carry over; an earlier ``ckpt_path``
    override is replaced by ``ckpt_path`` (None: kept as it was, for a run stopped before it saved anything).
    Hydra's own overrides (``hydra.run.dir``) are left out: the continuation gets a new run folder. Each item is
    shell-quoted (:func:`shlex.join`). ``script``: defaults to ``sys.argv[0]``. In a multirun job: how to rerun the
    sweep into its own folder instead (the job's folder then resumes in place, :mod:`grpolab.app.sweep_resume`).
    """
    from hydra.core.hydra_config import HydraConfig

    if in_multirun():  # a job of a sweep: rerun the sweep
        sweep = HydraConfig.get().sweep.dir
        return (f"rerun the sweep's command with hydra.sweep.dir={shlex.quote(str(sweep))} (finished jobs are "
                f"skipped, this one resumes from its last.ckpt; python sweeps/sweep_status.py {shlex.quote(str(sweep))} "
                "prints the command)")
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    if ckpt_path is not None:
        overrides = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != "ckpt_path"]
        overrides.append(f"ckpt_path={ckpt_path}")
    return shlex.join(["python", script or sys.argv[0], *overrides])
