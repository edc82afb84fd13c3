#!/usr/bin/env bash
# The three benchmarks/gpu_smoke.sh runs (same configs and steps), each in its own process through
# benchmarks/gpu_peak.py: CUDA peak allocated / reserved beside the memory plan's number. Needs one GPU.
#
#   bash benchmarks/gpu_peak.sh [DATA_DIR]   # DATA_DIR holds gsm8k/ and qwen2.5-tokenizer/ (default ../shared/data)
#
# Writes $OUTDIR/gpu_peak.jsonl (one record per run, see benchmarks/gpu_peak.py) and $OUTDIR/<run>.log;
# the run folders go to $RUNDIR. RUN_TIMEOUT (s): each run gets SIGINT after it (it then saves and the record is
# still written, "interrupted": true), and SIGKILL 30 s later.
set -u
cd "$(dirname "$0")/.."
D=$(realpath "${1:-../shared/data}")
OUTDIR=${OUTDIR:-outputs/gpu_peak}
RUNDIR=${RUNDIR:-$OUTDIR/runs}
PYTHON=${PYTHON:-python}
RUN_TIMEOUT=${RUN_TIMEOUT:-170}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1
COMMON=(data=gsm8k "data.path=$D/gsm8k/train.jsonl" "data.test_path=$D/gsm8k/test.jsonl" data.val_size=8
        verifier=gsm8k "model.tokenizer_path=$D/qwen2.5-tokenizer" model.init=random trainer=gpu
        trainer.val_check_interval=100000 trainer.enable_progress_bar=false save_policy=false "~callbacks.completions"
        algo.max_completion_length=128 val.batch_size=8 val.num_generations=2
        algo.num_generations=8 algo.per_device_train_batch_size=16)
run() {
    local name=$1; shift
    local start; start=$(date +%s)
    timeout -s INT -k 30 "$RUN_TIMEOUT" "$PYTHON" benchmarks/gpu_peak.py --name "$name" --out "$OUTDIR/gpu_peak.jsonl" \
        -- "${COMMON[@]}" "hydra.run.dir=$RUNDIR/$name" "$@" > "$OUTDIR/$name.log" 2>&1
    echo "=== $name: exit $? in $(( $(date +%s) - start )) s"
    grep '^gpu_peak:' "$OUTDIR/$name.log" || tail -5 "$OUTDIR/$name.log" | cut -c1-400
}
mkdir -p "$OUTDIR" "$RUNDIR"
run q05_onpolicy model=qwen0.5b trainer.max_steps=6
run q15_offpolicy_ckpt model=qwen1.5b algo=grpo_offpolicy algo.steps_per_generation=2 algo.beta=0.04 \
    model.gradient_checkpointing=true trainer.max_steps=4
run q15_adaptive_async model=qwen1.5b algo=grpo_offpolicy rollout=hf_copy rollout.async_generation=true \
    rollout.refresh=adaptive rollout.max_drift=0.05 trainer.max_steps=4
