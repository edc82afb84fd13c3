"""trainer.precision=16-mixed is refused: GRPOModule clips and checks the whole step's gradient
itself (manual optimization), before Lightning's GradScaler unscales it in ``optimizer.step()``: it would clip the
scaled gradient, stop at the overflows the scaler skips, and ``algo.skip_zero_grad_steps`` would trip the scaler's
"No inf checks were recorded" assertion. bf16-mixed (no scaler) is what modern GPUs use."""

import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.preflight import preflight
from grpolab.app.run import run_training
from grpolab.errors import ConfigError

# Lightning turns trainer.precision=16-mixed into bf16-mixed on CPU; the plugin given directly keeps a (CPU) GradScaler
SCALER_PLUGIN = ("trainer.plugins=[{_target_:grpolab.checkpoint.io.FileCheckpointIO},"
                 "{_target_:lightning.pytorch.plugins.precision.MixedPrecision,precision:16-mixed,device:cpu,"
                 "scaler:{_target_:torch.amp.GradScaler,device:cpu}}]")


@pytest.mark.parametrize("precision", ["16-mixed", "16"])
def test_preflight_refuses_fp16_with_a_grad_scaler(tmp_path, precision):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, f"trainer.precision={precision}"])
    with pytest.raises(ConfigError, match=rf"^trainer\.precision={precision} is not supported: .*bf16-mixed"):
        preflight(cfg)


def test_bf16_mixed_passes_preflight(tmp_path):
    assert preflight(compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.precision=bf16-mixed"])).algo


def test_a_grad_scaler_given_as_a_plugin_is_refused_before_the_first_step(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.max_steps=2", "val.at_start=false",
                                       "algo.skip_zero_grad_steps=true", SCALER_PLUGIN,
                                       "trainer.precision=null"])
    with pytest.raises(ConfigError, match=r"GradScaler \(trainer\.precision=16-mixed\) is not supported"):
        run_training(cfg)
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()
