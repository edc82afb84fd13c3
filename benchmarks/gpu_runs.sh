# Sourced by benchmarks/gpu_smoke.sh and benchmarks/gpu_peak.sh: the GPU runs at the real Qwen2.5 shapes they share
# (random weights, GSM8K prompts from $D, bf16-mixed on one GPU). The sourcing script defines `run NAME OVERRIDES...`,
# which runs src/train.py (its own way) with "${COMMON[@]}" and the overrides; `gpu_runs` calls it once per run.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1
COMMON=(data=gsm8k "data.path=$D/gsm8k/train.jsonl" "data.test_path=$D/gsm8k/test.jsonl" data.val_size=8
        verifier=gsm8k "model.tokenizer_path=$D/qwen2.5-tokenizer" model.init=random trainer=gpu
        trainer.val_check_interval=100000 trainer.enable_progress_bar=false save_policy=false "~callbacks.completions"
        algo.max_completion_length=128 val.batch_size=8 val.num_generations=2
        algo.num_generations=8 algo.per_device_train_batch_size=16)
gpu_runs() {
    run q05_onpolicy model=qwen0.5b trainer.max_steps=6
    run q15_offpolicy_ckpt model=qwen1.5b algo=grpo_offpolicy algo.steps_per_generation=2 algo.beta=0.04 \
        model.gradient_checkpointing=true trainer.max_steps=4
    run q15_adaptive_async model=qwen1.5b algo=grpo_offpolicy rollout=hf_copy rollout.async_generation=true \
        rollout.refresh=adaptive rollout.max_drift=0.05 trainer.max_steps=4
}
