"""Run-folder names: the job's distinguishing overrides (``hydra.job.override_dirname``), made safe to pass back.

``conf/hydra/default.yaml`` names a run ``<timestamp>_<overrides>`` and a multirun job ``<num>_<overrides>``,
e.g. ``outputs/train/2026-01-01_12-00-00-000000_seed-1+algo-grpo_offpolicy``. The overrides are joined with
``+`` and ``-`` (not Hydra's ``,`` and ``=``), so a path with the folder in it is still one plain Hydra value
(``model.path=outputs/train/<run>/policy``); ``/`` in a value becomes ``~``, ``seed`` goes first, and a name
longer than :data:`MAX_CHARS` is cut and ends with ``_`` and 8 hex digits of a hash of the whole name (two
long names that differ only after the cut get two folders).
Importing :mod:`grpolab` registers the ``grpolab_dirname`` resolver.
"""

from __future__ import annotations

import hashlib
import re
import warnings

from omegaconf import OmegaConf

MAX_CHARS = 200  # a folder name has at most 255 bytes


def dirname_suffix(overrides: str, sep: str = "_") -> str:
    """``sep + overrides`` made safe for a folder name and a Hydra value, or ``""`` when there are none.

    Args:
        overrides: ``hydra.job.override_dirname``.
        sep: what goes between the timestamp (or job number) and the overrides.
    """
    if not overrides:
        return ""
    items = str(overrides).split("+")
    items = [i for i in items if i.startswith("seed-")] + [i for i in items if not i.startswith("seed-")]
    name = re.sub(r"[^\w.+~@-]", "~", "+".join(items).replace("/", "~"))
    if len(name) > MAX_CHARS:  # cut, with a hash of the whole name: two long names that share a start stay apart
        name = f"{name[:MAX_CHARS - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"  # not "~": Hydra refuses it
    return sep + name


if not OmegaConf.has_resolver("grpolab_dirname"):
    OmegaConf.register_new_resolver("grpolab_dirname", dirname_suffix)

# conf/hydra/launcher/joblib.yaml is checked against the joblib plugin's schema of the same name on purpose (a
# misspelt launcher key is refused); Hydra warns about that matching in every process (launcher and workers)
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/joblib' is validated against ConfigStore schema")
