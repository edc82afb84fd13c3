"""The printed resume line: the run's own overrides as typed, one ckpt_path (the new one), shell-quoted."""

from __future__ import annotations

import shlex

from conftest import compose_train_cfg

from grpolab.app.cli import resume_command


def test_resume_command_keeps_the_overrides_and_replaces_ckpt_path(tmp_path):
    compose_train_cfg(tmp_path, ["trainer.max_steps=2000", "ckpt_path=/old/last.ckpt", "algo=grpo_offpolicy",
                                 "data.val_size=8"])
    argv = shlex.split(resume_command(tmp_path / "new dir" / "last.ckpt", script="src/train.py"))
    assert argv == ["python", "src/train.py", "trainer.max_steps=2000", "algo=grpo_offpolicy", "data.val_size=8",
                    f"ckpt_path={tmp_path / 'new dir' / 'last.ckpt'}"]


def test_resume_command_without_a_new_checkpoint_is_the_run_itself(tmp_path):
    """Stopped before the first step: nothing saved; the continuation is the same command (its ckpt_path too)."""
    compose_train_cfg(tmp_path, ["seed=3", "ckpt_path=/old/last.ckpt"])
    assert shlex.split(resume_command(None, script="t.py")) == ["python", "t.py", "seed=3", "ckpt_path=/old/last.ckpt"]
