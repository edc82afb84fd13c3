"""``logger=tensorboard`` keeps one TensorBoard run across resumes, read back with TensorBoard's own reader: every
step's scalars once, steps and wall times increasing, the config as hyperparameters; after a resume into the same
run folder from a periodic checkpoint (a multirun rerun, a requeued SLURM job: the steps logged after it are
dropped) and after a resume by hand into a new run folder (conf/logger/tensorboard.yaml)."""

from __future__ import annotations

from conftest import FAST_OVERRIDES, compose_train_cfg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from grpolab.app.run import run_training
from grpolab.callbacks.resumed_run import checkpoint_step
from grpolab.callbacks.tensorboard_events import carry_events, event_files

COMMON = [*FAST_OVERRIDES, "logger=tensorboard", "val.at_start=false", "trainer.val_check_interval=2",
          "callbacks.periodic_checkpoint.every_n_train_steps=2", "save_policy=false"]


def _read(run_dir):
    acc = EventAccumulator(str(run_dir / "tensorboard"), purge_orphaned_data=False)  # a duplicate would show
    acc.Reload()
    return acc


def _steps(acc, tag):
    events = acc.Scalars(tag)
    walls = [e.wall_time for e in events]
    assert walls == sorted(walls), f"{tag}: wall time goes back"
    return [e.step for e in events]


def _hparams(acc):
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    return plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams


def test_a_resumed_run_continues_one_tensorboard_run(tmp_path):
    first = tmp_path / "first"
    run_training(compose_train_cfg(first, [*COMMON, "trainer.max_steps=4"]))
    assert _steps(_read(first), "train/loss") == [0, 1, 2, 3] and _steps(_read(first), "val/accuracy") == [2, 4]
    # the same folder from step2.ckpt, as a rerun after a kill at step 4: steps 2, 3 and val at 4 are logged anew
    step2 = first / "checkpoints" / "step2.ckpt"
    run_training(compose_train_cfg(first, [*COMMON, "trainer.max_steps=5", f"ckpt_path={step2}"]))
    acc = _read(first)
    assert _steps(acc, "train/loss") == [0, 1, 2, 3, 4] and _steps(acc, "val/accuracy") == [2, 4, 5]
    assert _steps(acc, "epoch") == [0, 1, 2, 3, 4, 4, 5]  # one per row: val 4 and train 4 both (val 2's was dropped)
    files = [f.name for f in event_files(first / "tensorboard")]
    assert files[0].endswith(".carried") and not any(f.endswith(".carried") for f in files[1:])  # read first
    # by hand into a new run folder from last.ckpt (step 4: the periodic save; val 5 ran after training): the new
    # folder holds the whole run, up to step 4 carried
    resumed = tmp_path / "resumed"
    last = first / "checkpoints" / "last.ckpt"
    assert checkpoint_step(last) == 4
    run_training(compose_train_cfg(resumed, [*COMMON, "trainer.max_steps=6", f"ckpt_path={last}"]))
    acc = _read(resumed)
    assert _steps(acc, "train/loss") == [0, 1, 2, 3, 4, 5] and _steps(acc, "val/accuracy") == [2, 4, 6]
    assert _steps(acc, "train/reward") == list(range(6))
    hparams = _hparams(acc)  # the resumed run's config, logged once
    assert hparams["trainer/max_steps"].number_value == 6 and hparams["algo/learning_rate"].number_value == 1e-4
    assert hparams["ckpt_path"].string_value == str(last) and "hydra/run/dir" not in hparams
    assert _steps(_read(first), "train/loss") == [0, 1, 2, 3, 4]  # the first folder is left as it was


def test_a_carry_cut_short_and_redone_keeps_each_step_once(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path)) as writer:  # a run killed after step 5, its checkpoint at step 3
        for step in range(6):
            writer.add_scalar("train/loss", 1.0 / (step + 1), step)
        writer.add_scalar("val/accuracy", 0.5, 3)
    (old,) = event_files(tmp_path)
    kept = old.read_bytes()
    carried = carry_events(tmp_path, tmp_path, 3)
    assert event_files(tmp_path) == [carried]
    old.write_bytes(kept)  # as if the carry stopped before it removed the old file
    carry_events(tmp_path, tmp_path, 3)
    acc = EventAccumulator(str(tmp_path), purge_orphaned_data=False)
    acc.Reload()
    assert _steps(acc, "train/loss") == [0, 1, 2] and _steps(acc, "val/accuracy") == [3]
