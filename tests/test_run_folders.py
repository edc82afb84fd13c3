"""Run folders carry the job's distinguishing overrides in their name, and stay passable back to Hydra."""

from __future__ import annotations

from pathlib import Path

from conftest import compose_train_cfg
from hydra.core.override_parser.overrides_parser import OverridesParser

from grpolab.app.hydra_names import dirname_suffix


def test_a_run_folder_names_its_overrides_but_not_paths(tmp_path):
    cfg = compose_train_cfg(tmp_path, ["algo=grpo_offpolicy", "seed=1", "ckpt_path=/a/last.ckpt",
                                       "paths.cache_dir=/tmp/c"])
    name = Path(cfg.hydra.run.dir).name
    assert name.endswith("_seed-1+algo-grpo_offpolicy"), name  # seed first: it survives a cut
    assert Path(cfg.hydra.run.dir).parent == Path("outputs/train")
    plain = Path(compose_train_cfg(tmp_path, []).hydra.run.dir).name
    assert "_" in plain and not plain.endswith("_") and "-" in plain  # the timestamp alone
    # README: model.path="$(ls -d outputs/train/*/policy | tail -n 1)" must stay one plain Hydra value
    override = OverridesParser.create().parse_override(f"model.path={cfg.hydra.run.dir}/policy")
    assert override.value() == f"{cfg.hydra.run.dir}/policy"


def test_a_multirun_job_is_its_number_then_its_overrides():
    cfg_subdir = "3" + dirname_suffix("algo-grpo_offpolicy+seed-1")
    assert cfg_subdir == "3_seed-1+algo-grpo_offpolicy"
    assert dirname_suffix("") == ""
    assert dirname_suffix("data.path-../x/y.jsonl") == "_data.path-..~x~y.jsonl"  # never a nested folder
    assert len(dirname_suffix("a-" + "b" * 500)) <= 201
    long_a, long_b = (dirname_suffix("a-" + "b" * 300 + end) for end in ("+c-1", "+c-2"))  # alike up to the cut
    assert long_a != long_b and len(long_a) == len(long_b) == 201 and long_a[:192] == long_b[:192]
    from hydra.core.override_parser.overrides_parser import (
        OverridesParser,  # the cut name is still a plain value
    )

    OverridesParser.create().parse_overrides([f"model.path=outputs/train/2026{long_a}/policy"])
