"""Memory plan of a GRPO run: bytes per process, from the model's shape and the run's settings.

Pure arithmetic on integers: no model, tokenizer or tensor is built, and nothing here imports torch or
Lightning. :mod:`grpolab.app.plan_from_config` reads a composed config into :class:`PlanInputs`, logs the table and
refuses a run that cannot fit before anything is loaded.

What a process holds (a Qwen2-style decoder: q/k/v with biases, SwiGLU MLP, RMSNorm, optional tied head):

* persistent: the weights; AdamW's two moment tensors (``torch.optim.AdamW`` allocates them with
  ``zeros_like(param)``, so they take the parameter's dtype); the reference model (a copy of the weights when
  ``algo.beta > 0`` with full fine-tuning; nothing with ``beta = 0`` or LoRA, whose reference is the base with
  the adapters off); the sampler, as its engine declares it (:class:`~grpolab.plan.sampler_memory.SamplerMemory`:
  a copy of the weights, a reserved cache, a kept push; nothing in place); DDP's gradient buckets (a second copy of the gradients,
  ``gradient_as_bucket_view`` is off); under FSDP the unsharded root (embeddings, head) and two decoder layers
  gathered at a time;
* the training step: the gradients plus the largest of the activations of one micro-batch, for the
  non-fused AdamW its ``foreach`` temporaries (one tensor of the trainable parameters' size), and, when a tied
  embedding is trained, its backward's two extra ``vocab x hidden`` tensors (the head's matmul gradient and the
  lookup's dense gradient exist beside their sum at the end of the backward, when the activations are freed:
  measured 2.0 x ``vocab x hidden`` above the kept gradients on a tied random Qwen2; untied, each gradient
  goes straight to its own ``.grad``);
* generation: what the engine holds only while generating (a decode loop's KV cache of every sequence decoded
  at once plus the decode step's float32 logits; held-out sampling's on the live policy).

Synchronous runs hold the training step and generation at different times (the peak takes the larger);
``rollout.async_generation`` overlaps them (the peak takes both).

Activation constants were measured as the peak RSS of a forward + backward through
``grpolab.forward.logprob_pass.completion_log_probs`` (sdpa attention, random Qwen2 models, CPU): the logits of the
completion positions cost 12 bytes per element in float32 (the logits, the gradient built by the per-row
log-softmax and the sliced logits' gradient) and 11 under bfloat16 autocast; a decoder layer keeps
``12 h + 4 i + 2 kv_dim`` elements per token (within 7% of the measurement for h = 256..512,
i = 512..1408), 3 bytes each on average under 16-bit compute (RMSNorm works in float32; measured 3.07);
one layer's backward adds ``10 h`` per token; LoRA adds 1.5 elements per output feature of each adapted
projection (measured 1.44 with all seven adapted; fewer adapted projections measured less).

Gradient checkpointing (``model.gradient_checkpointing``: Hugging Face's ``gradient_checkpointing_enable`` wraps every
decoder layer in ``torch.utils.checkpoint``, non-reentrant): the forward keeps only each layer's input, ``tokens x h``
in the residual stream's dtype (the weights': float32 weights under bf16 autocast keep a float32 residual); the
backward recomputes one layer at a time, so one layer's activations (and its backward temporaries) are live on top of
the kept inputs. The shared-prompt forward is off under checkpointing (it would append to the KV cache twice), so every
row runs its full prompt. Measured (``tests/test_plan_verdict.py``): each further layer adds its input's
``tokens x h`` exactly, and the plan is 1.4x a checkpointed backward's transient on a small model.
Checked against the eight rows of ``benchmarks/memory.py``'s 100M-parameter table in docs/results/real_shapes.md (the plan is
-8% to +8% of each measured peak RSS, with 115 prompt tokens: the mean longest of two GSM8K prompts; the
checkpointed rows -8% to +5%) and against a tiny training run's peak RSS in ``tests/test_plan_run.py``.

Checkpoint saves add nothing: :class:`grpolab.checkpoint.io.FileCheckpointIO` (``trainer.plugins``) streams
them to disk (Lightning's own ``TorchCheckpointIO`` would hold a second copy of the weights and optimizer state,
the real-shape runs' unplanned peak before it).

Ignored: the allocator's fragmentation and caching: the CUDA caching allocator; glibc's heap. Under glibc's
dynamic mmap threshold (``malloc_mmap_threshold=null``) glibc serves tensors under 32 MiB from the heap, whose
freed holes stay resident: not planned, so ``malloc_mmap_threshold: auto`` fixes the threshold for every model but
the embedded tiny ones (:mod:`grpolab.app.malloc`; measured: a tiny model's step with 20 MiB logit rows 20% above the
plan under the dynamic threshold, 1% fixed; a Qwen2.5-1.5B LoRA step with checkpointing 37% above, 6% under fixed).
Also ignored: the CUDA context beyond ``RUNTIME_BYTES``, attention score matrices (sdpa's fused kernels do not materialise them for GQA
models; the math fallback would), no-grad log-prob passes (reference, sampler, lower bound: smaller than the
training pass), the prompt activations of generation's prefill, the data set and Python objects,
DeepSpeed's ZeRO partitioning (planned as DDP), and prompts shorter than the planned length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from grpolab.errors import ConfigError

MIB = 1 << 20
GIB = 1 << 30
# the embedded ~1M-parameter models: the plan, malloc_mmap_threshold=auto and torch_threads=auto treat them as small
SMALL_MODEL_TARGETS = ("grpolab.models.TinyCharModel", "grpolab.models.TinyQwenModel")
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LOGIT_BYTES = {4: 12, 2: 11}          # bytes per completion-logit element of one training micro-batch (measured)
LAYER_ELEMENTS = (12, 4, 2)           # per token and layer: 12 h + 4 i + 2 kv_dim (measured, float32)
BACKWARD_ELEMENTS_PER_H = 10          # one layer's backward temporaries per token, in units of h
MIXED_ACTIVATION_BYTES = 3            # average bytes per activation element under 16-bit compute (measured 3.07)
DECODE_LOGIT_COPIES = 3               # float32 logits, tempered copy, softmax of one decode step
LORA_ELEMENTS_PER_OUT = 1.5           # LoRA: per token and layer, x the adapted projections' output widths (measured 1.44)
TIED_GRAD_COPIES = 2                  # full fine-tuning of a tied embedding: transient vocab x hidden tensors (measured 2.0)
RUNTIME_BYTES = 768 * MIB             # CPU: imports, tokenizer, data, Lightning (measured ~700 MiB); GPU: CUDA context


@dataclass(frozen=True)
class ModelShape:
    """The ``config.json`` values that size a Qwen2-style decoder.

    Attributes:
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        vocab_size: positive ints. tie_word_embeddings: the head shares the embedding matrix.
        head_dim: per-head width; None = ``hidden_size // num_attention_heads``.
        attention_bias: q/k/v projections carry biases (Qwen2: true).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool = True
    head_dim: int | None = None
    attention_bias: bool = True

    @classmethod
    def from_mapping(cls, values: Any, key: str = "model.architecture") -> ModelShape:
        """From a ``config.json``-like mapping (extra keys ignored).

        Raises:
            ValueError: naming ``<key>.<field>`` when a size is missing or not a positive int, or when
                ``num_attention_heads`` is not a multiple of ``num_key_value_heads``.
        """
        values = dict(values)
        sizes = {}
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size"):
            v = values.get(name, values.get("num_attention_heads") if name == "num_key_value_heads" else None)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ConfigError(f"{key}.{name} must be an int >= 1, got {v!r}")
            sizes[name] = v
        if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
            raise ConfigError(f"{key}.num_attention_heads={sizes['num_attention_heads']} must be a multiple of "
                              f"{key}.num_key_value_heads={sizes['num_key_value_heads']}")
        head_dim = values.get("head_dim")
        return cls(**sizes, tie_word_embeddings=bool(values.get("tie_word_embeddings", True)),
                   head_dim=int(head_dim) if head_dim else None,
                   attention_bias=bool(values.get("attention_bias", True)))

    @property
    def dim_head(self) -> int:
        """Per-head width: ``head_dim`` when given, else ``hidden_size // num_attention_heads``."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        """Width of one token's key (or value) in one layer: ``num_key_value_heads x head_dim``."""
        return self.num_key_value_heads * self.dim_head


def linear_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of each projection of one decoder layer, by module name."""
    h, i, q = shape.hidden_size, shape.intermediate_size, shape.num_attention_heads * shape.dim_head
    return {"q_proj": (h, q), "k_proj": (h, shape.kv_dim), "v_proj": (h, shape.kv_dim), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def layer_parameter_count(shape: ModelShape) -> int:
    """Parameters of one decoder layer: the seven projections, q/k/v biases, two RMSNorm weights."""
    linears = linear_shapes(shape)
    count = sum(a * b for a, b in linears.values()) + 2 * shape.hidden_size
    if shape.attention_bias:
        count += sum(linears[k][1] for k in ("q_proj", "k_proj", "v_proj"))
    return count


def parameter_count(shape: ModelShape) -> int:
    """Parameters of the causal LM: embeddings, layers, final norm, and the head when not tied.

    Example: Qwen2.5-0.5B (896, 4864, 24 layers, 14/2 heads, 151,936 tokens, tied) has 494,032,768.
    """
    head = 0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size
    return (shape.vocab_size * shape.hidden_size + shape.num_hidden_layers * layer_parameter_count(shape)
            + shape.hidden_size + head)


def lora_parameter_count(shape: ModelShape, r: int, target_modules: Any = LINEAR_NAMES) -> int:
    """LoRA adapter parameters: ``r x (in + out)`` per adapted projection and layer (PEFT's A and B).

    Args:
        r: adapter rank (>= 1).
        target_modules: projection names, or ``"all-linear"`` (every projection; PEFT leaves the head out).

    Raises:
        ValueError: naming ``model.lora.target_modules`` when a name is not a projection of the layer.
    """
    linears = linear_shapes(shape)
    names = list(linears) if target_modules == "all-linear" else list(target_modules)
    unknown = [n for n in names if n not in linears]
    if unknown:
        raise ConfigError(f"model.lora.target_modules {unknown} name no projection of a Qwen2 layer; "
                          f"the projections are {list(linears)}")
    return shape.num_hidden_layers * sum(r * sum(linears[n]) for n in dict.fromkeys(names))


def kv_cache_bytes(shape: ModelShape, sequences: int, tokens: int, element_bytes: int) -> int:
    """Keys and values of ``sequences`` rows of ``tokens`` positions in every layer (GQA: kv heads only)."""
    return sequences * tokens * shape.num_hidden_layers * 2 * shape.kv_dim * element_bytes


def logits_bytes(shape: ModelShape, rows: int, completion_length: int, compute_bytes: int) -> int:
    """Training-pass logits of one micro-batch: ``rows x (L + 1) x V`` at :data:`LOGIT_BYTES` per element."""
    return rows * (completion_length + 1) * shape.vocab_size * LOGIT_BYTES[4 if compute_bytes >= 4 else 2]


def layer_activation_bytes(shape: ModelShape, rows: int, prompt_length: int, completion_length: int,
                           compute_bytes: int, checkpointing: bool, prompts: int | None = None,
                           lora_widths: int = 0, hidden_bytes: int | None = None) -> int:
    """Decoder activations kept for the backward of one micro-batch.

    Args:
        rows: completions in the micro-batch. prompt_length, completion_length: tokens per row.
        compute_bytes: 4 (float32) or 2 (16-bit compute, planned at :data:`MIXED_ACTIVATION_BYTES`).
        checkpointing: only each layer's input is kept (``hidden_bytes`` per element), and one recomputed layer is
            live during the backward (module docstring); the plain forward over every row's full prompt.
        prompts: distinct prompts when the shared-prompt forward runs each prompt once (its KV cache is then
            expanded to every row: ``2 h + 2 kv_dim`` more elements per row and prompt token per layer);
            None = the plain forward over ``rows x (prompt + completion)`` tokens.
        lora_widths: summed output features of the LoRA-adapted projections of one layer (0 = no LoRA).
        hidden_bytes: bytes per element of the residual stream (the layers' inputs kept under checkpointing);
            None = the activations' element size.

    Returns:
        Bytes. Example: h = 512, i = 1408, 2 kv heads of 64, 16 rows of 64 + 128 tokens, float32, 4 layers,
        plain forward: (4 x 3072 x 12,032 + 3072 x 5,120) x 4 = 654,311,424.
    """
    h = shape.hidden_size
    per_layer = (LAYER_ELEMENTS[0] * h + LAYER_ELEMENTS[1] * shape.intermediate_size + LAYER_ELEMENTS[2] * shape.kv_dim
                 + math.ceil(LORA_ELEMENTS_PER_OUT * lora_widths))
    element = 4 if compute_bytes >= 4 else MIXED_ACTIVATION_BYTES
    if prompts is None or checkpointing:
        tokens, expanded = rows * (prompt_length + completion_length), 0
    else:
        tokens = prompts * prompt_length + rows * completion_length
        expanded = rows * prompt_length * (2 * h + 2 * shape.kv_dim)
    n = shape.num_hidden_layers
    backward = tokens * BACKWARD_ELEMENTS_PER_H * h
    if checkpointing:  # every layer's input, then one layer recomputed at a time with its backward
        return n * tokens * h * (hidden_bytes or element) + (tokens * per_layer + backward) * element
    return (n * (tokens * per_layer + expanded) + backward) * element


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan depends on, per process (see :mod:`grpolab.app.plan_from_config` for the config keys).

    Attributes:
        shape: the model. param_bytes: bytes per weight (2 or 4). compute_bytes: bytes per activation, logit
            and KV element (2 under 16-bit compute, else 4). autocast: ``*-mixed`` precision (float32 weights
            are then also cast to 16 bits once per step). adapter_bytes: bytes per LoRA parameter (PEFT keeps
            adapters in float32 unless the precision converts the whole model).
        lora_r, lora_target_modules: ``model.lora``. beta: ``algo.beta``. fused_optimizer: AdamW ``fused``.
        sampler: what the engine declared (``GenerationEngine.memory_needs``), a
            :class:`~grpolab.plan.sampler_memory.SamplerMemory` (its totals, knobs and notes read, not imported:
            sampler_memory builds on this module); None = no sampler memory.
            async_generation: generation overlaps training.
        completions_per_step, micro_batch_size, num_generations, prompt_length, completion_length: ``algo``.
        gradient_checkpointing,
            shared_prompt_forward: forward options. strategy: ``single`` | ``ddp`` | ``fsdp``. world_size:
            processes. max_steps: optimizer steps (None = unknown). steps_per_buffer: ``k x i``.
    """

    shape: ModelShape
    param_bytes: int = 4
    compute_bytes: int = 4
    autocast: bool = False
    adapter_bytes: int = 4
    lora_r: int | None = None
    lora_target_modules: Any = LINEAR_NAMES
    beta: float = 0.0
    fused_optimizer: bool = True
    sampler: Any = None  # a SamplerMemory (see above)
    async_generation: bool = False
    completions_per_step: int = 64
    micro_batch_size: int | None = None
    num_generations: int = 8
    prompt_length: int = 256
    completion_length: int = 256
    gradient_checkpointing: bool = False
    shared_prompt_forward: bool = True
    strategy: str = "single"
    world_size: int = 1
    max_steps: int | None = None
    steps_per_buffer: int = 1


@dataclass
class MemoryPlan:
    """A plan: named terms in bytes, how they add up to the peak, and the run's step arithmetic.

    Attributes:
        terms: name -> bytes per process (``weights``, ``optimizer``, ``reference``, ``sampler``,
            ``ddp_buckets``, ``fsdp_gathered``, ``runtime``, ``gradients``, ``activations``,
            ``optimizer_step``, ``tied_embedding_grad``, ``kv_cache``).
        peak_bytes: persistent terms + the training step and generation (their max, or their sum when async).
        num_params, num_trainable: parameter counts. tokens_per_step: prompt + completion tokens of one
            optimizer step on this process (upper bound). sampler_refreshes, weight_pushes: per run (None when
            ``trainer.max_steps`` is unknown). notes: assumptions to print under the table. knobs: term -> the
            settings the engine names that shrink it (``sampler``, ``kv_cache``).
    """

    terms: dict[str, int]
    peak_bytes: int
    num_params: int
    num_trainable: int
    tokens_per_step: int
    sampler_refreshes: int | None
    weight_pushes: int | None
    notes: list[str] = field(default_factory=list)
    knobs: dict[str, tuple[str, ...]] = field(default_factory=dict)

    PERSISTENT = ("weights", "optimizer", "reference", "sampler", "ddp_buckets", "fsdp_gathered", "runtime")

    def largest(self, n: int = 3) -> list[tuple[str, int]]:
        """The ``n`` largest terms that count towards the peak, largest first."""
        return sorted(((k, v) for k, v in self.terms.items() if v > 0), key=lambda kv: -kv[1])[:n]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"peak_bytes", "terms_bytes", "num_params", ...}`` (for ``summary.json``)."""
        return {"peak_bytes": self.peak_bytes, "peak_gib": round(self.peak_bytes / GIB, 3),
                "terms_bytes": dict(self.terms), "num_params": self.num_params, "num_trainable": self.num_trainable,
                "tokens_per_step": self.tokens_per_step, "sampler_refreshes": self.sampler_refreshes,
                "weight_pushes": self.weight_pushes, "notes": list(self.notes)}


def plan_memory(x: PlanInputs) -> MemoryPlan:
    """The memory plan of one process for the settings ``x`` (see the module docstring for the model).

    Under FSDP the weights, gradients, optimizer state and reference are divided by ``world_size``; under DDP
    every process holds all of them.

    Raises:
        ValueError: naming ``model.lora.target_modules`` for a name that is not a projection.
    """
    s = x.shape
    params = parameter_count(s)
    adapters = lora_parameter_count(s, x.lora_r, x.lora_target_modules) if x.lora_r else 0
    trainable, train_bytes = (adapters, x.adapter_bytes) if x.lora_r else (params, x.param_bytes)
    shard = x.world_size if x.strategy == "fsdp" else 1
    model_bytes = params * x.param_bytes + adapters * x.adapter_bytes
    grads = trainable * train_bytes
    terms = {"weights": math.ceil(model_bytes / shard), "optimizer": math.ceil(2 * grads / shard),
             "reference": 0 if (x.beta == 0 or x.lora_r) else math.ceil(params * x.param_bytes / shard),
             "sampler": 0, "ddp_buckets": grads if x.strategy == "ddp" else 0, "fsdp_gathered": 0,
             "runtime": RUNTIME_BYTES, "gradients": math.ceil(grads / shard)}
    if x.strategy == "fsdp" and x.world_size > 1:  # the root unit (embeddings, head) and two layers unsharded
        root = s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)
        terms["fsdp_gathered"] = (root + 2 * layer_parameter_count(s)) * x.param_bytes
    tokens = x.prompt_length + x.completion_length
    terms["sampler"] = x.sampler.resident_bytes if x.sampler else 0  # the engine's own arithmetic (memory_needs)
    rows = min(x.micro_batch_size or x.completions_per_step, x.completions_per_step)
    prompts = None
    if x.shared_prompt_forward and x.num_generations > 1:
        prompts = min(rows, -(-rows // x.num_generations) + (1 if rows % x.num_generations else 0))
    widths = 0
    if x.lora_r:
        names = LINEAR_NAMES if x.lora_target_modules == "all-linear" else dict.fromkeys(x.lora_target_modules)
        widths = sum(linear_shapes(s)[n][1] for n in names)
    act = logits_bytes(s, rows, x.completion_length, x.compute_bytes) + layer_activation_bytes(
        s, rows, x.prompt_length, x.completion_length, x.compute_bytes, x.gradient_checkpointing, prompts, widths,
        hidden_bytes=x.param_bytes)
    if x.autocast and x.param_bytes == 4:  # autocast caches a 16-bit copy of every weight it casts
        act += params * 2
    terms["activations"] = act
    terms["optimizer_step"] = 0 if x.fused_optimizer else math.ceil(grads / shard)
    terms["tied_embedding_grad"] = (TIED_GRAD_COPIES * s.vocab_size * s.hidden_size * train_bytes
                                    if s.tie_word_embeddings and not x.lora_r else 0)
    terms["kv_cache"] = x.sampler.generation_bytes if x.sampler else 0
    persistent = sum(terms[k] for k in MemoryPlan.PERSISTENT)
    training = terms["gradients"] + max(terms["activations"], terms["optimizer_step"], terms["tied_embedding_grad"])
    peak = persistent + (training + terms["kv_cache"] if x.async_generation else max(training, terms["kv_cache"]))
    refreshes = pushes = None
    if x.max_steps is not None and x.max_steps > 0:
        refreshes = -(-x.max_steps // x.steps_per_buffer)
        pushes = max(refreshes - 1, 0) if x.async_generation else refreshes
    sampler = x.sampler
    return MemoryPlan(terms=terms, peak_bytes=peak, num_params=params + adapters, num_trainable=trainable,
                      tokens_per_step=x.completions_per_step * tokens, sampler_refreshes=refreshes,
                      weight_pushes=pushes, notes=list(sampler.notes) if sampler else [],
                      knobs={"sampler": sampler.knobs, "kv_cache": sampler.cache_knobs} if sampler else {})


LABELS = {
    "weights": "weights", "optimizer": "AdamW moments (2)", "reference": "reference model",
    "sampler": "sampler", "ddp_buckets": "DDP gradient buckets", "fsdp_gathered": "FSDP unsharded root + 2 layers",
    "runtime": "runtime allowance", "gradients": "gradients", "activations": "activations (1 micro-batch)",
    "optimizer_step": "AdamW foreach temporaries", "tied_embedding_grad": "tied embedding backward (2 V x h)",
    "kv_cache": "generation KV cache + decode logits",
}


def format_plan(plan: MemoryPlan, header: str = "", budget: int | None = None, budget_source: str = "") -> str:
    """A plain-text table: one row per term in GiB, the peak, and the budget it is compared with."""
    lines = [header] if header else []
    lines.append(f"  {'term':<38} {'GiB':>9}")
    for key, label in LABELS.items():
        lines.append(f"  {label:<38} {plan.terms[key] / GIB:>9.3f}")
    lines.append(f"  {'peak per process':<38} {plan.peak_bytes / GIB:>9.3f}")
    if budget is not None:
        verdict = "fits" if plan.peak_bytes <= budget else "DOES NOT FIT"
        lines.append(f"  {'available (' + budget_source + ')':<38} {budget / GIB:>9.3f}  {verdict}")
    elif budget_source:
        lines.append(f"  available: unknown ({budget_source})")
    lines.append(f"  params {plan.num_params:,}, trainable {plan.num_trainable:,}; tokens per step per process "
                 f"<= {plan.tokens_per_step:,}; sampler refreshes {plan.sampler_refreshes}, weight pushes "
                 f"{plan.weight_pushes}")
    lines.extend(f"  note: {n}" for n in plan.notes)
    return "\n".join(lines)
