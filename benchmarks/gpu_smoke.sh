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
source benchmarks/gpu_runs.sh   # COMMON and gpu_runs: the runs both scripts make
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
gpu_runs
