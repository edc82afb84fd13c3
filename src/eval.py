"""Evaluate a policy on a task's test split: mean@n, pass@k, maj@k, greedy accuracy, lengths.

    python src/eval.py model.path=outputs/train/<run>/policy             # a run's exported policy
    python src/eval.py ckpt_path=outputs/train/<run>/checkpoints/last.ckpt
    python src/eval.py model.path=outputs/train/<run>/policy eval.num_samples=32 eval.ks=[1,8,32]
    python src/eval.py model=qwen0.5b data=gsm8k verifier=gsm8k algo.max_completion_length=256   # hub id

The task, verifier and sampling settings come from the training config groups (conf/eval.yaml). Outputs
land in the Hydra run folder (outputs/eval/<timestamp>/): eval.json and completions.jsonl. A config error
prints one line, ``eval.py: error: ...``, and exits with status 2 (``GRPOLAB_TRACEBACK=1``: the traceback).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # allow `python src/eval.py` without install

from grpolab.app.cli import check_overrides, report_user_errors, skip_the_exit_collection  # noqa: E402
from grpolab.app.console import guard_console  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"


@hydra.main(version_base="1.3", config_path="../conf", config_name="eval")
def main(cfg: DictConfig) -> float | None:
    with report_user_errors("eval.py"):
        from grpolab.app.malloc import apply_config

        apply_config(cfg)
        from grpolab.app.preflight import import_plugins

        import_plugins(cfg.get("imports") or [])  # and the working directory on the path, as training has it: a
        # reward function of one's own (verifier.reward_funcs.<name>._target_=my_reward.reward) is found in both
        from grpolab.evaluation.evaluate import evaluate  # torch: after the override check

        return evaluate(cfg).get("accuracy")


if __name__ == "__main__":
    skip_the_exit_collection()  # about 1 s of CPU less at exit (grpolab/app/cli.py)
    guard_console()  # a closed stdout/stderr (| tee killed by Ctrl-C, | head) cannot stop the run
    check_overrides(CONFIG_DIR, "eval", "eval.py")  # a misspelt key: one line naming the closest keys
    main()
