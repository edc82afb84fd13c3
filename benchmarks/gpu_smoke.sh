#!/usr/bin/env bash
# The GPU paths at the real Qwen2.5 shapes (random weights, no download): bf16-mixed on one GPU, gradient
# checkpointing at 1.5B, and the copy engine with asynchronous generation and adaptive refresh. A few steps each;
# prints each run's exit status, wall time and last metrics. Not CI (CI has no GPU).
#
#   bash benchmarks/gpu_smoke.sh [DATA_DIR]     # DATA_DIR holds gsm8k/ and qwen2.5-tokenizer/ (default ../shared/data)
set -u
cd "$(dirname "$0")/.."
D=$(realpath "${1:-../shared/data}")
OUTDIR=${OUTDIR:-outputs/gpu_smoke}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1
COMMON=(data=gsm8k "data.path=$D/gsm8k/train.jsonl" "data.test_path=$D/gsm8k/test.jsonl" data.val_size=8
        verifier=gsm8k "model.tokenizer_path=$D/qwen2.5-tokenizer" model.init=random trainer=gpu
        trainer.val_check_interval=100000 trainer.enable_progress_bar=false save_policy=false "~callbacks.completions"
        algo.max_completion_length=128 val.batch_size=8 val.num_generations=2
        algo.num_generations=8 algo.per_device_train_batch_size=16)
run() {
    local name=$1; shift
    local start; start=$(date +%s)
    python src/train.py "${COMMON[@]}" "hydra.run.dir=$OUTDIR/$name" "$@" > "$OUTDIR/$name.log" 2>&1
    echo "=== $name: exit $? in $(( $(date +%s) - start )) s"
    python - "$OUTDIR/$name" <<'PY'
import sys
import pandas as pd
m = pd.read_csv(sys.argv[1] + "/metrics.csv").dropna(subset=["train/loss"])
cols = [c for c in ("step", "train/loss", "train/step_time", "train/time/rollout", "train/rollout/drift") if c in m]
print(m[cols].tail(3).to_string(index=False))
PY
}
mkdir -p "$OUTDIR"
run q05_onpolicy model=qwen0.5b trainer.max_steps=6
run q15_offpolicy_ckpt model=qwen1.5b algo=grpo_offpolicy algo.steps_per_generation=2 algo.beta=0.04 \
    model.gradient_checkpointing=true trainer.max_steps=4
run q15_adaptive_async model=qwen1.5b algo=grpo_offpolicy rollout=hf_copy rollout.async_generation=true \
    rollout.refresh=adaptive rollout.max_drift=0.05 trainer.max_steps=4
