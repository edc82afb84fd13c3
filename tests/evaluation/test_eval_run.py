"""src/eval.py end to end on a small trained run: a policy/ folder, a Lightning checkpoint, the val split."""

import json
import sys

import forkrun
import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

from grpolab.app.run import run_training
from grpolab.evaluation.evaluate import evaluate

# the model/data overrides of FAST_OVERRIDES that an eval of such a run must repeat
MODEL_DATA = [o for o in FAST_OVERRIDES if o.startswith(("model.", "data."))]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = compose_train_cfg(out, [*FAST_OVERRIDES, "trainer.max_steps=3", "trainer.val_check_interval=3",
                                  "callbacks.model_checkpoint.every_n_train_steps=3", "algo.learning_rate=1e-3"])
    summary = run_training(cfg)
    return out, summary


def compose_eval_cfg(output_dir, overrides):
    return compose_train_cfg(output_dir, overrides, config_name="eval")


def _eval(out, overrides):
    cfg = compose_eval_cfg(out, [*MODEL_DATA, "eval.progress_bar=false", *overrides])
    result = evaluate(cfg)
    completions = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    return result, completions


def test_eval_on_policy_folder_and_on_checkpoint_agree(trained_run, tmp_path):
    run, _ = trained_run
    common = ["eval.num_samples=4", "eval.max_prompts=8"]
    res_dir, comp_dir = tmp_path / "folder", tmp_path / "ckpt"
    by_folder, rows_folder = _eval(res_dir, [f"model.path={run / 'policy'}", *common])
    by_ckpt, rows_ckpt = _eval(comp_dir, [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", *common])
    on_disk = json.loads((res_dir / "eval.json").read_text())
    assert on_disk["num_prompts"] == 8 and on_disk["num_samples"] == 4 and on_disk["ks"] == [1, 2, 4]
    for key in ("accuracy", "pass@1", "pass@4", "maj@4", "greedy_accuracy", "mean_length", "truncated_ratio"):
        assert key in on_disk
    assert on_disk["pass@1"] <= on_disk["pass@2"] <= on_disk["pass@4"]
    assert on_disk["run"]["run_dir"] == str(run) and "data_differs" not in on_disk["run"]
    # every completion with its verdict: 8 prompts x (4 samples + 1 greedy)
    assert len(rows_folder) == 8 * 5
    assert {"uid", "prompt", "gold", "completion", "reward", "correct", "truncated", "greedy"} <= set(rows_folder[0])
    # last.ckpt holds the final weights, saved as policy/: the same seed must give the same completions
    assert [r["completion"] for r in rows_folder] == [r["completion"] for r in rows_ckpt]
    assert by_folder["accuracy"] == by_ckpt["accuracy"] and by_ckpt["ckpt_path"].endswith("last.ckpt")


def test_eval_on_the_val_split_reproduces_the_runs_validation(trained_run, tmp_path):
    # Same prompts, samples per prompt, batch and RNG seed as the run's last validation (GRPOModule seeds
    # 12345 + global_step): the held-out statistics must match summary.json exactly.
    run, summary = trained_run
    last = summary["val_history"][-1]
    result, _ = _eval(tmp_path, [f"model.path={run / 'policy'}", "eval.split=val", "eval.num_samples=2",
                                 f"eval.seed={12345 + last['step']}", "eval.batch_size=64"])
    assert result["accuracy"] == pytest.approx(last["accuracy"], abs=1e-9)
    assert result["mean_length"] == pytest.approx(last["mean_length"], abs=1e-9)
    assert result["truncated_ratio"] == pytest.approx(last["truncated_ratio"], abs=1e-9)
    assert result["greedy_accuracy"] == pytest.approx(last["greedy_accuracy"], abs=1e-9)


def test_eval_warns_when_the_task_differs_from_the_run(trained_run, tmp_path):
    run, _ = trained_run
    result, _ = _eval(tmp_path, [f"model.path={run / 'policy'}", "data_seed=1", "eval.num_samples=1", "eval.max_prompts=2",
                                 "eval.greedy=false"])
    assert result["run"]["data_differs"] == ["seed"]


def test_checkpoint_of_another_architecture_is_refused(trained_run, tmp_path):
    run, _ = trained_run
    cfg = compose_eval_cfg(tmp_path, [*MODEL_DATA, "model.hidden_size=64", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    with pytest.raises(RuntimeError, match="size mismatch"):
        evaluate(cfg)


@pytest.mark.parametrize("override,key", [("eval.ks=[1,8]", "eval.ks"), ("eval.num_samples=0", "eval.num_samples"),
                                          ("eval.split=dev", "eval.split"), ("eval.dataset=aime24", "eval.dataset")])
def test_invalid_settings_name_the_key_before_any_model_is_built(tmp_path, override, key):
    cfg = compose_eval_cfg(tmp_path, [*MODEL_DATA, "eval.num_samples=4", override])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        evaluate(cfg)
    assert not (tmp_path / "cache").exists()


def test_cli_writes_eval_json_and_shows_progress(trained_run, tmp_path):
    run, _ = trained_run
    out = tmp_path / "cli"
    proc = forkrun.run(
        [sys.executable, "src/eval.py", f"model.path={run / 'policy'}", *MODEL_DATA, "eval.num_samples=2",
         "eval.max_prompts=4", f"hydra.run.dir={out}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval test" in proc.stderr and "4/4" in proc.stderr  # tqdm progress bar
    result = json.loads((out / "eval.json").read_text())
    assert result["num_prompts"] == 4 and (out / "completions.jsonl").exists()


def test_eval_ignores_the_folders_generation_config(trained_run, tmp_path):
    # a generation_config.json with repetition_penalty, no_repeat_ngram_size, temperature, top_k
    # and top_p must not change what eval.py samples (sampled and greedy): same completions as without them.
    import shutil

    from transformers import GenerationConfig

    run, _ = trained_run
    folder = tmp_path / "policy"
    shutil.copytree(run / "policy", folder)
    gc = GenerationConfig.from_pretrained(folder)
    gc.repetition_penalty, gc.no_repeat_ngram_size, gc.temperature, gc.top_k, gc.top_p = 1.3, 2, 0.3, 3, 0.5
    gc.do_sample = True
    gc.save_pretrained(folder)
    common = ["eval.num_samples=4", "eval.max_prompts=8"]
    _, plain = _eval(tmp_path / "plain", [f"model.path={run / 'policy'}", *common])
    _, loaded = _eval(tmp_path / "loaded", [f"model.path={folder}", *common])
    assert [r["completion"] for r in loaded] == [r["completion"] for r in plain]
