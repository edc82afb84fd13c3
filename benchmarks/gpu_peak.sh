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
source benchmarks/gpu_runs.sh   # COMMON and gpu_runs: the runs both scripts make
run() {
    local name=$1; shift
    local start; start=$(date +%s)
    timeout -s INT -k 30 "$RUN_TIMEOUT" "$PYTHON" benchmarks/gpu_peak.py --name "$name" --out "$OUTDIR/gpu_peak.jsonl" \
        -- "${COMMON[@]}" "hydra.run.dir=$RUNDIR/$name" "$@" > "$OUTDIR/$name.log" 2>&1
    echo "=== $name: exit $? in $(( $(date +%s) - start )) s"
    grep '^gpu_peak:' "$OUTDIR/$name.log" || tail -5 "$OUTDIR/$name.log" | cut -c1-400
}
mkdir -p "$OUTDIR" "$RUNDIR"
gpu_runs
