"""How much resident memory glibc keeps after a training step, per decoder layer at Qwen2.5-0.5B widths.

    python benchmarks/malloc_retention.py                          # 2 and 8 layers, glibc's default (dynamic) mmap threshold
    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/malloc_retention.py   # a fixed threshold: freed tensors go back to the OS

Each layer count runs in its own process: a bf16 Qwen2 model (hidden 896, intermediate 4864, 14 heads, 2 KV heads,
a 1000-token vocabulary so the embedding does not dominate), two forward/backward/AdamW steps on 4 x 160 tokens,
one torch thread. It prints the resident set after the second step (VmRSS, MiB) and its growth per layer. What a
layer must hold after a step is its weights plus AdamW's two states: 3 x 14.9M x 2 bytes = 85 MiB.

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so
later gradient and activation tensors come from the heap and stay resident after they are freed, which adds up
over 24 layers; the measured figures and the gap they explained between the memory plan and the
0.5B bf16 rows' peak: docs/results/real_shapes.md ("glibc's mmap threshold").
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
layers = int(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512, tie_word_embeddings=True)
model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
ids = torch.randint(0, 1000, (4, 160))
for _ in range(2):
    model(input_ids=ids).logits.float().log_softmax(-1).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(json.dumps({"layers": layers, "rss_mib": rss_mib()}))
"""


def main() -> None:
    rows = []
    for layers in (2, 8):
        out = subprocess.run([sys.executable, "-c", PROBE, str(layers)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{layers} layers: RSS after 2 steps {rows[-1]['rss_mib']:.0f} MiB", flush=True)
    per_layer = (rows[1]["rss_mib"] - rows[0]["rss_mib"]) / (rows[1]["layers"] - rows[0]["layers"])
    print(f"per layer: {per_layer:.0f} MiB (weights + AdamW states: 85 MiB)")


if __name__ == "__main__":
    main()
