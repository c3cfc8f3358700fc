"""Per-device memory of a GRPO run: parameters, gradients, AdamW state, reference copy, sampler KV cache and
training activations, for a model config on a ('data', 'fsdp', 'tensor'[, 'expert']) mesh
(`python scripts/memory_estimate.py` is the same command); with --plan, the mesh, micro-batch and remat that fit.

  python -m grpo_jax.commands.memory_estimate --model qwen2.5-7b --mesh 1,8,1
  python -m grpo_jax.commands.memory_estimate --hf-config path/to/config.json --mesh 2,4,1 --param-dtype bfloat16
  python -m grpo_jax.commands.memory_estimate --table     # the docs/scaling.md table
  python -m grpo_jax.commands.memory_estimate --table gemma3   # the docs/models.md table (Gemma 3 1B-27B)
  python -m grpo_jax.commands.memory_estimate --model qwen3-30b-a3b --param-dtype bfloat16 --plan --devices 8 \
      --device-memory-gib 79.6 --sampler-batch 256        # a GRPO step of a mixture of experts on 8 H100s
  python -m grpo_jax.commands.memory_estimate --table moe      # the docs/models.md table (Qwen3-30B-A3B, gpt-oss-20b)
  python -m grpo_jax.commands.memory_estimate --table hybrid   # the docs/models.md table (Qwen3.5 0.8B, 27B)
  python -m grpo_jax.commands.memory_estimate --table gemma4   # the docs/models.md table (Gemma 4 E2B, 31B)

Parameters are counted exactly, shard by shard, with the trainer's own sharding rules (`LOGICAL_RULES` applied
to the model's logical axis names; a dimension its mesh axes do not divide is replicated). Gradients are held
in the parameter dtype (the update accumulates them like the parameters) and sharded like them; AdamW keeps two
moments in the parameter dtype (optax's default: with float32 parameters, 2 x fp32). The reference copy is one
more set of parameters (none with beta = 0, none on the device with `offload_ref_params`). The 'expert' mesh axis
splits the expert weights by expert (and fsdp / tensor their other dimensions); with a mixture of experts the
command also prints the active parameters: k / E of the expert weights, all of the others.

Estimates (not measured; XLA's buffer reuse and fusion change them):
- KV cache of the sampler: layers x 2 (k, v) x batch x (prompt + new tokens) x kv_heads x head_dim in the compute
  dtype, the batch split over data x fsdp x expert and the kv heads over tensor (when they divide). A sliding-window
  layer (Gemma 3, gpt-oss) holds min(window, prompt + new tokens) slots instead, and a linear-attention layer
  (Qwen3.5) a fixed-size cache per row: its convolution's last K - 1 inputs (C channels, compute dtype) and its
  float32 state [Hv, Dk, Dv], whatever the length. Each layer with its own kv heads and head_dim (Gemma 4's global
  layers); a layer that reads another's keys and values (Gemma 4's last num_kv_shared_layers) holds none.
- Activations kept for the backward pass of one micro-batch (rows split over data x fsdp x expert), per token and
  layer: 4 D (the two norms' inputs and outputs) + 2 (N + 2K) H (q, k, v before and after RoPE) + N H (attention
  output) + 3 F (gate, up, their product) in the compute dtype, the head and MLP terms split over tensor, plus
  the attention scores N x T in float32 and the probabilities in the compute dtype. With remat only each
  layer's input (D per token) is kept, plus one layer's activations while it is recomputed. Both add the
  log-prob chunk: micro-batch rows x chunk x V float32 logits, twice (softmax and its gradient). The
  attention scores are counted over all T keys in sliding-window layers too (the full-sequence forward masks
  the window; it does not skip the keys outside it). A mixture-of-experts layer keeps, instead of 3 F, the router
  logits (E, float32), the token's input and output once per chosen expert (2 k D: the rows sorted by expert)
  and the experts' gate, up and product (3 k F_moe, split over tensor); attention sinks add nothing material. A
  linear-attention layer keeps, instead of the attention terms, 4 D + 3 C (projection, convolution, SiLU) + 3 Hv Dv
  (gate z, output, normed output) + 2 Hv in the compute dtype and, in float32, its chunked form's per-token share:
  three 64 x 64 matrices per head (64 x 3 Hv), the solved values and keys (Hv (Dk + Dv)) and the state at each
  chunk's start (Hv Dk Dv / 64); C, Hv split over tensor. Every term with the layer's own head_dim, kv heads and
  MLP width (Gemma 4); a layer reading another's keys and values keeps no k, v of its own; Gemma 4's expert block
  beside the MLP keeps the expert terms on top of 3 F, and its per-layer input 2 P + D (gate, product, projection).
- With a shared prompt forward (`prompt_repeats` s > 1, `model.share_prompt_forward`), a micro-batch of b rows
  runs b / s prompts of P tokens and b completions of C tokens, so the token count above is b/s P + b C
  instead of b (P + C); each layer's keys and values over P + C slots, copied to every row, are kept as well
  (2 K H per row and slot, in the remat count too, where they are the layer's second input; none for a layer that
  reads another's).
- With LoRA (`--lora-rank` r > 0, `model.lora_rank`): the base parameters are stored as before but take no
  gradients and no optimizer state; the adapters (r (D_in + D_out) per adapted projection and layer, E of them
  on an expert projection, replicated; the projections and sizes each layer has, `lora.layer_projection_sizes`)
  take both; there is no reference copy (the reference is the base model,
  adapters off). Each adapted projection keeps x A (r) and the update's output (D_out) per token and layer (k
  times on an expert projection) for the backward pass.

--plan tries every mesh of --devices devices (data x fsdp x tensor x expert, the expert axis dividing E), every
micro-batch that divides the sampler batch into whole rows per batch shard, remat on and off, and keeps those
whose total (everything above, the sampler's KV cache included) is at most FIT_FRACTION of the device's memory:
the largest micro-batch, then remat off, then the least memory. Nothing fits: it says so, with the plan of least
memory. The parameter dtype is the one given (--param-dtype); the reference's presence is --no-ref.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
from typing import NamedTuple

from flax import nnx

from grpo_jax.model import Transformer
from grpo_jax.commands import exit_on_mistake
from grpo_jax.model.config import (FULL, LINEAR, SLIDING, LinearRopeScaling, ModelConfig, YarnRopeScaling,
                                    from_hf_config)
from grpo_jax.model.linear_attention import channels as linear_channels
from grpo_jax.model.lora import layer_projection_sizes, parse_targets
from grpo_jax.model.sharding import LOGICAL_RULES, logical_to_spec
from grpo_jax.model.transformer import cache_slots  # a sliding-window layer caches its window only

def _qwen2(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
           tie_word_embeddings) -> dict:
  """A Qwen2.5 preset: biased q/k/v projections, every layer global."""
  return dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
              num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
              tie_word_embeddings=tie_word_embeddings, attention_bias=True, family="qwen2")


# Shapes from the public Hugging Face config.json files of the Qwen2.5 base models.
PRESETS = {
    "qwen2.5-0.5b": _qwen2(151936, 896, 4864, 24, 14, 2, 64, tie_word_embeddings=True),
    "qwen2.5-1.5b": _qwen2(151936, 1536, 8960, 28, 12, 2, 128, tie_word_embeddings=True),
    "qwen2.5-3b": _qwen2(151936, 2048, 11008, 36, 16, 2, 128, tie_word_embeddings=True),
    "qwen2.5-7b": _qwen2(152064, 3584, 18944, 28, 28, 4, 128, tie_word_embeddings=False),
    "qwen2.5-32b": _qwen2(152064, 5120, 27648, 64, 40, 8, 128, tie_word_embeddings=False),
}


def _gemma3(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim=256,
            sliding_window=1024, query_pre_attn_scalar=256, linear_rope_factor=None) -> dict:
  """A Gemma 3 preset: every 6th layer global, the others sliding (window `sliding_window`)."""
  return dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
              num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
              tie_word_embeddings=True, qk_norm=True, family="gemma3_text", rope_theta=1_000_000.0,
              local_rope_theta=10_000.0, sliding_window=sliding_window, query_pre_attn_scalar=query_pre_attn_scalar,
              layer_types=tuple(SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)),
              rope_scaling=None if linear_rope_factor is None else LinearRopeScaling(linear_rope_factor))


# Gemma 3 from the public config.json files of google/gemma-3-{270m,1b}-pt and the text_config of
# google/gemma-3-{4b,12b,27b}-pt (their language models; the vision tower is not counted).
PRESETS.update({
    "gemma3-270m": _gemma3(262144, 640, 2048, 18, 4, 1, sliding_window=512),
    "gemma3-1b": _gemma3(262144, 1152, 6912, 26, 4, 1, sliding_window=512),
    "gemma3-4b": _gemma3(262208, 2560, 10240, 34, 8, 4, linear_rope_factor=8.0),
    "gemma3-12b": _gemma3(262208, 3840, 15360, 48, 16, 8, linear_rope_factor=8.0),
    "gemma3-27b": _gemma3(262208, 5376, 21504, 62, 32, 16, head_dim=128, query_pre_attn_scalar=168,
                          linear_rope_factor=8.0),
})


def _qwen3_moe(num_layers, num_experts, num_experts_per_tok, moe_intermediate_size) -> dict:
  """A Qwen3-MoE preset: every layer's feed-forward the expert block (decoder_sparse_step 1, no mlp_only_layers)."""
  return dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=num_layers, num_heads=32,
              num_kv_heads=4, head_dim=128, rope_theta=1_000_000.0, qk_norm=True, family="qwen3_moe",
              num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
              moe_intermediate_size=moe_intermediate_size, norm_topk_prob=True)


def _gpt_oss(num_layers, num_experts) -> dict:
  """A gpt-oss preset: layers alternate sliding (window 128, first) and full attention, with sinks and biases;
  every feed-forward is the expert block (intermediate_size is one expert's)."""
  return dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_layers=num_layers, num_heads=64,
              num_kv_heads=8, head_dim=64, rope_theta=150_000.0, rms_norm_eps=1e-5, family="gpt_oss",
              rope_scaling=YarnRopeScaling(32.0, 4096, truncate=False), max_position_embeddings=131072,
              layer_types=tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers)), sliding_window=128,
              attention_bias=True, o_bias=True, attention_sinks=True, num_experts=num_experts,
              num_experts_per_tok=4, moe_intermediate_size=2880, router="topk_softmax", expert_bias=True,
              swiglu_limit=7.0)


# Mixtures of experts: the public Hugging Face config.json values of Qwen/Qwen3-30B-A3B and openai/gpt-oss-{20b,120b}.
PRESETS.update({
    "qwen3-30b-a3b": _qwen3_moe(48, 128, 8, 768),
    "gpt-oss-20b": _gpt_oss(24, 32),
    "gpt-oss-120b": _gpt_oss(36, 128),
})


def _qwen3_5(hidden_size, intermediate_size, num_layers, num_heads, linear_value_heads, tie_word_embeddings) -> dict:
  """A Qwen3.5 preset: every 4th layer full attention (2 or 4 KV heads of 256, gated output, RoPE on a quarter of
  each head), the others Gated DeltaNet (16 query/key heads of 128, value heads of 128, 4 convolution taps)."""
  return dict(vocab_size=248320, hidden_size=hidden_size, intermediate_size=intermediate_size, num_layers=num_layers,
              num_heads=num_heads, num_kv_heads=2 if hidden_size <= 1024 else 4, head_dim=256, rope_theta=1e7,
              partial_rotary_factor=0.25, tie_word_embeddings=tie_word_embeddings, qk_norm=True,
              attention_output_gate=True, family="qwen3_5_text", max_position_embeddings=262144,
              layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(num_layers)),
              linear_num_key_heads=16, linear_num_value_heads=linear_value_heads, linear_key_head_dim=128,
              linear_value_head_dim=128)


# Qwen3.5's language models, from the text_config of Qwen/Qwen3.5-{0.8B,27B} (the vision tower is not counted).
PRESETS.update({
    "qwen3.5-0.8b": _qwen3_5(1024, 3584, 24, 8, 16, tie_word_embeddings=True),
    "qwen3.5-27b": _qwen3_5(5120, 17408, 64, 24, 48, tie_word_embeddings=False),
})


def _gemma4(text_config: dict) -> dict:
  """A Gemma 4 preset: ModelConfig's fields for a gemma4_text config.json (Gemma4TextConfig's defaults for what
  it does not give, as from_hf_config reads a checkpoint)."""
  cfg = from_hf_config({"model_type": "gemma4_text", **text_config})
  return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("param_dtype", "dtype")}


# Gemma 4's language models (the vision and audio towers are not counted), from the text_config of
# google/gemma-4-E2B and google/gemma-4-31B as copied into several independent open-source loaders' tests (no hub
# access here; each value below agreed in at least two of them): E2B 35 layers of 1536, 4 sliding (window 512)
# then 1 global, 8 heads, 1 kv head, head_dim 256 (512 global), MLP 6144 (12288 on the last 20 layers, which read
# layers 13 and 14's keys and values), per-layer inputs of 256; 31B 60 layers of 5376, 5 sliding (window 1024)
# then 1 global, 32 heads, 16 kv heads (4 global, attention_k_eq_v), head_dim 256 (512 global), MLP 21504, no
# per-layer inputs and no shared layers. Both tied, vocabulary 262144, soft-capping 30. Uncertain: max_position_
# embeddings (131072 for E2B, 262144 for 31B as reported) changes no estimate. Not here: E4B and 26B-A4B, whose
# reported configs disagreed between sources (E4B's kv heads and shared layers, 26B-A4B's global kv heads).
_GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
PRESETS.update({
    "gemma4-e2b": _gemma4(dict(
        vocab_size=262144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512, max_position_embeddings=131072,
        layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(35)],
        hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, num_kv_shared_layers=20,
        use_double_wide_mlp=True, attention_k_eq_v=False, final_logit_softcapping=30.0, rope_parameters=_GEMMA4_ROPE,
        tie_word_embeddings=True)),
    "gemma4-31b": _gemma4(dict(
        vocab_size=262144, hidden_size=5376, intermediate_size=21504, num_hidden_layers=60, num_attention_heads=32,
        num_key_value_heads=16, num_global_key_value_heads=4, attention_k_eq_v=True, head_dim=256,
        global_head_dim=512, sliding_window=1024, max_position_embeddings=262144,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(60)],
        hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
        final_logit_softcapping=30.0, rope_parameters=_GEMMA4_ROPE, tie_word_embeddings=True)),
})
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024 ** 3


class Workload(NamedTuple):
  sampler_batch: int = 512      # completions per sampler call (prompts_per_step x group_size)
  prompt_len: int = 512
  new_tokens: int = 1024
  micro_batch: int = 0          # completions per forward/backward, global; 0: one row per data x fsdp device
  logprob_chunk: int = 128
  use_ref: bool = True          # beta > 0
  offload_ref: bool = False     # config.model.offload_ref_params
  prompt_repeats: int = 1       # rows per prompt forward in the update (config.prompt_repeats)
  lora_rank: int = 0            # config.model.lora_rank (0: full fine-tuning)
  lora_targets: str = "all"     # config.model.lora_targets


class Mesh(NamedTuple):
  data: int
  fsdp: int
  tensor: int
  expert: int = 1  # splits the expert weights by expert, and the batch

  @property
  def shape(self) -> dict:
    return self._asdict()

  @property
  def batch_ways(self) -> int:
    return self.data * self.fsdp * self.expert


def model_config(name_or_path: str, param_dtype: str, dtype: str):
  if name_or_path in PRESETS:
    return ModelConfig(**PRESETS[name_or_path], param_dtype=param_dtype, dtype=dtype)
  path = os.path.join(name_or_path, "config.json") if os.path.isdir(name_or_path) else name_or_path
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--hf-config {name_or_path}: {path} does not exist (give a Hugging Face config.json "
                            "or the directory that holds it)")
  with open(path) as f:
    return from_hf_config(json.load(f)).replace(param_dtype=param_dtype, dtype=dtype)


@functools.lru_cache(maxsize=16)  # tracing the model's shapes is slow, and plans and tables ask again and again
def _param_shapes(cfg) -> tuple[tuple[tuple[int, ...], tuple], ...]:
  """(shape, logical axis names) of each parameter of a model of shape `cfg`."""
  abstract = nnx.state(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  out = []
  for _, v in nnx.to_flat_state(abstract):
    shape = v.get_value().shape
    out.append((shape, v.get_metadata().get("out_sharding") or (None,) * len(shape)))
  return tuple(out)


def param_shapes(cfg):
  """_param_shapes, traced once per shape whatever the dtypes."""
  return _param_shapes(cfg.replace(param_dtype="float32", dtype="float32", remat=False))


@functools.lru_cache(maxsize=1024)
def param_elements(cfg, mesh: Mesh) -> tuple[int, int]:
  """(total parameters, parameters per device) with the trainer's sharding rules."""
  total = per_device = 0
  for shape, names in param_shapes(cfg):
    spec = logical_to_spec(names, mesh, LOGICAL_RULES, shape)
    local = 1
    for size, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
      axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
      local *= size // math.prod(mesh.shape[a] for a in axes)
    total += math.prod(shape)
    per_device += local
  return total, per_device


def active_params(cfg) -> int:
  """Parameters a token uses: k / E of the expert weights (those with an 'expert' axis), all of the others."""
  experts = sum(math.prod(shape) for shape, names in param_shapes(cfg) if "expert" in names)
  total = sum(math.prod(shape) for shape, _ in param_shapes(cfg))
  return total - experts + experts * cfg.num_experts_per_tok // max(cfg.num_experts, 1)


def _split(n: int, ways: int) -> int:
  """n spread over `ways` devices when it divides, else replicated."""
  return n // ways if n % ways == 0 else n


def lora_sizes(cfg, rank: int, targets: str, layer: int = 0) -> tuple[int, int]:
  """(adapter parameters, elements kept per token for the backward pass: r + D_out per adapted projection) of
  layer `layer`, for LoRA of rank `rank` on `targets` (0, 0 without LoRA), with the projections and sizes the
  layer has (`lora.layer_projection_sizes`). In an expert block, gate/up/down adapt each of the E experts, and a
  token passes through k of them."""
  if rank == 0:
    return 0, 0
  params = kept = 0
  chosen = parse_targets(targets)
  for sizes, experts in layer_projection_sizes(cfg, layer):
    for t, (d_in, d_out) in sizes.items():
      if t in chosen:
        params += (cfg.num_experts if experts else 1) * rank * (d_in + d_out)
        kept += (cfg.num_experts_per_tok if experts else 1) * (rank + d_out)
  return params, kept


def ffn_kept(cfg, layer: int, tp: int, ab: int) -> int:
  """Bytes per token that layer `layer`'s feed-forward keeps for the backward pass: gate, up and their product
  (3 F) in a dense layer; in a mixture-of-experts layer the router logits (E, float32), the token's input and
  output copied to each of its k experts (the rows sorted by expert) and each expert's gate, up and product
  (3 k F_moe); Gemma 4's expert block beside its MLP both. F splits over tensor; F is the layer's own
  (Gemma 4's double-wide MLPs)."""
  dense = 3 * _split(cfg.layer_intermediate_size(layer), tp) * ab
  if not cfg.is_moe(layer):
    return dense
  k = cfg.num_experts_per_tok
  experts = 4 * cfg.num_experts + (2 * k * cfg.hidden_size + 3 * k * _split(cfg.moe_intermediate_size, tp)) * ab
  return dense + experts if cfg.gemma4 else experts


def kv_bytes(cfg, layer: int, tp: int, ab: int) -> int:
  """Bytes of layer `layer`'s keys and values per slot (its own kv heads, split over tensor when they divide, and
  head_dim); 0 for a layer that reads another's (`cfg.kv_source`)."""
  if cfg.kv_source(layer) is not None:
    return 0
  return 2 * _split(cfg.layer_kv_heads(layer), tp) * cfg.layer_head_dim(layer) * ab


def attention_kept(cfg, layer: int, tp: int, ab: int, T: int) -> int:
  """Bytes per token an attention layer keeps for the backward pass (module docstring), with its own head
  geometry; a layer that reads another's keys and values keeps only its queries' terms."""
  D, H, heads = cfg.hidden_size, cfg.layer_head_dim(layer), _split(cfg.num_heads, tp)
  kv = 0 if cfg.kv_source(layer) is not None else _split(cfg.layer_kv_heads(layer), tp)
  return (4 * D + 2 * (heads + 2 * kv) * H + heads * H) * ab + heads * T * (4 + ab)


def linear_cache_bytes(cfg, tp: int, ab: int) -> int:
  """Bytes per row of a linear-attention layer's sampler cache: the convolution window in the compute dtype and the
  float32 state, channels and value heads split over tensor."""
  Hv = _split(cfg.linear_num_value_heads, tp)
  return (cfg.linear_conv_kernel - 1) * _split(linear_channels(cfg), tp) * ab + Hv * cfg.linear_key_head_dim * \
      cfg.linear_value_head_dim * 4


def linear_kept(cfg, tp: int, ab: int) -> int:
  """Bytes per token a linear-attention layer's mixer keeps for the backward pass (module docstring)."""
  C, Hv = _split(linear_channels(cfg), tp), _split(cfg.linear_num_value_heads, tp)
  Dk, Dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
  return (4 * cfg.hidden_size + 3 * C + 3 * Hv * Dv + 2 * Hv) * ab + Hv * (3 * 64 + Dk + Dv + Dk * Dv // 64) * 4


def estimate(cfg, mesh: Mesh, w: Workload = Workload()) -> dict[str, int]:
  """Bytes per device by category (see the module docstring for what each counts)."""
  pb, ab = DTYPE_BYTES[cfg.param_dtype], DTYPE_BYTES[cfg.dtype]
  total, local = param_elements(cfg, mesh)
  D, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
  T = w.prompt_len + w.new_tokens
  tp = mesh.tensor
  lora = [lora_sizes(cfg, w.lora_rank, w.lora_targets, i) for i in range(L)]
  if w.lora_rank:  # only the (replicated) adapters train; the reference is the base itself
    adapters = sum(params for params, _ in lora)
    out = {"num_params": total, "trainable": adapters, "params": (local + adapters) * pb, "grads": adapters * pb,
           "optimizer": 2 * adapters * pb, "ref_params": 0}
  else:
    out = {"num_params": total, "trainable": total, "params": local * pb, "grads": local * pb,
           "optimizer": 2 * local * pb, "ref_params": local * pb if w.use_ref and not w.offload_ref else 0}
  # per row: each attention layer's slots of keys and values, each linear layer's fixed-size cache
  row_cache = [linear_cache_bytes(cfg, tp, ab) if cfg.is_linear(i)
               else cache_slots(cfg, i, T) * kv_bytes(cfg, i, tp, ab) for i in range(L)]
  out["kv_cache"] = _split(w.sampler_batch, mesh.batch_ways) * sum(row_cache)
  rows = max(1, (w.micro_batch or mesh.batch_ways) // mesh.batch_ways)
  if w.prompt_repeats > 1:
    tokens = -(-rows // w.prompt_repeats) * w.prompt_len + rows * w.new_tokens
    # the prompt's cache copied to each row, per layer: keys/values (over all T slots), or a linear layer's window
    # and state
    shared = [rows * (linear_cache_bytes(cfg, tp, ab) if cfg.is_linear(i) else T * kv_bytes(cfg, i, tp, ab))
              for i in range(L)]
  else:
    tokens, shared = rows * T, [0] * L
  P = cfg.per_layer_input_size
  per_layer_input = (2 * P + D) * ab if P else 0  # Gemma 4: the gate, its product with the input, the projection
  layers = [tokens * ((linear_kept(cfg, tp, ab) if cfg.is_linear(i) else attention_kept(cfg, i, tp, ab, T))
                      + ffn_kept(cfg, i, tp, ab) + per_layer_input + lora[i][1] * ab) + shared[i] for i in range(L)]
  logits = 2 * rows * min(w.logprob_chunk, T) * _split(V, tp) * 4
  out["activations"] = sum(layers) + logits
  out["activations_remat"] = L * tokens * D * ab + sum(shared) + max(layers) + logits
  out["total"] = sum(out[k] for k in ("params", "grads", "optimizer", "ref_params", "kv_cache", "activations"))
  out["total_remat"] = out["total"] - out["activations"] + out["activations_remat"]
  return out


COLUMNS = ("params", "grads", "optimizer", "ref_params", "kv_cache", "activations", "activations_remat",
           "total", "total_remat")


# The configurations of docs/scaling.md: (model, mesh, param dtype, workload).
TABLE = [
    ("qwen2.5-0.5b", Mesh(1, 1, 1), "float32", Workload(sampler_batch=256)),
    ("qwen2.5-0.5b", Mesh(8, 1, 1), "float32", Workload()),
    ("qwen2.5-7b", Mesh(1, 8, 1), "float32", Workload()),
    ("qwen2.5-7b", Mesh(1, 8, 1), "bfloat16", Workload()),
    ("qwen2.5-7b", Mesh(2, 8, 1), "bfloat16", Workload(offload_ref=True)),
    ("qwen2.5-32b", Mesh(1, 8, 1), "bfloat16", Workload()),
    ("qwen2.5-32b", Mesh(1, 16, 2), "float32", Workload()),
    ("qwen2.5-32b", Mesh(2, 8, 4), "bfloat16", Workload(offload_ref=True)),
]


# The Gemma 3 configurations of docs/models.md: one 80 GB GPU (1,1,1) and a TPU slice of 8 chips (fsdp 8), bf16
# compute; the sampler batch is 64 x (512 + 1024) tokens here, a GSM8K-sized GRPO step.
GEMMA3_TABLE = [(name, mesh, pdt, Workload(sampler_batch=64, micro_batch=mesh.batch_ways * 4, lora_rank=lora))
                for name in ("gemma3-1b", "gemma3-4b", "gemma3-12b", "gemma3-27b")
                for mesh, pdt, lora in ((Mesh(1, 1, 1), "bfloat16", 0), (Mesh(1, 1, 1), "bfloat16", 16),
                                        (Mesh(1, 8, 1), "float32", 0), (Mesh(1, 8, 1), "bfloat16", 0))]


# The accelerators of --table moe: (devices, bytes per device). An H100 SXM 80GB reports 81559 MiB (nvidia-smi, as
# benchmarks/roofline.py's HBM_BYTES); a TPU v5p-8 slice is 4 chips (8 TensorCores, 2 per chip; JAX sees one device
# per chip) of 95 GiB HBM each (cloud.google.com/tpu/docs/v5p-training).
ACCELERATORS = {"8 x H100 80GB": (8, 81559 * 2 ** 20), "TPU v5p-8": (4, 95 * GIB)}
H100 = {"1 x H100 80GB": (1, 81559 * 2 ** 20), "8 x H100 80GB": (8, 81559 * 2 ** 20)}
# A plan fits where the estimate is at most FIT_FRACTION of the device's memory: JAX's pool is 0.95 of it
# (XLA_PYTHON_CLIENT_MEM_FRACTION, as scripts/train.py sets it) and benchmarks/roofline.py's plans keep a margin
# of 0.8 of that (this estimate was 6% under XLA's peak for the 0.5B update on an H200; the pool fragments).
FIT_FRACTION = 0.95 * 0.8
# The GRPO step of --table moe: 16 GSM8K prompts x G = 16 completions of up to 1024 tokens after 512 of prompt.
MOE_WORKLOAD = Workload(sampler_batch=256, prompt_len=512, new_tokens=1024)


class Plan(NamedTuple):
  fits: bool
  mesh: Mesh
  micro_batch: int  # global rows per forward/backward
  remat: bool
  bytes: int        # the estimate's total per device


def meshes(devices: int, num_experts: int) -> list[Mesh]:
  """Every (data, fsdp, tensor, expert) of `devices` devices whose expert axis divides the experts (1 without)."""
  ways = [n for n in range(1, devices + 1) if devices % n == 0]
  return [Mesh(d, f, t, devices // (d * f * t)) for d in ways for f in ways for t in ways
          if devices % (d * f * t) == 0 and max(num_experts, 1) % (devices // (d * f * t)) == 0]


def plan(cfg, devices: int, device_bytes: int, w: Workload, group_size: int = 16) -> Plan:
  """A GRPO step's mesh, micro-batch (a divisor of the sampler batch, whole rows per batch shard) and remat on
  `devices` devices of `device_bytes` each: of the plans within FIT_FRACTION of it, the largest micro-batch, then
  remat off, then the least memory; when none fits, the one of least memory (fits False). Each prompt runs once
  for gcd(micro-batch, group_size) rows (model.share_prompt_forward, the trainer's default)."""
  plans = []
  for mesh in meshes(devices, cfg.num_experts):
    for micro in range(mesh.batch_ways, w.sampler_batch + 1, mesh.batch_ways):
      if w.sampler_batch % micro == 0:
        est = estimate(cfg, mesh, w._replace(micro_batch=micro, prompt_repeats=math.gcd(micro, group_size)))
        plans += [Plan(est[key] <= FIT_FRACTION * device_bytes, mesh, micro, remat, est[key])
                  for remat, key in ((False, "total"), (True, "total_remat"))]
  if not plans:
    raise ValueError(f"no mesh of {devices} devices splits a sampler batch of {w.sampler_batch} rows")
  fitting = [p for p in plans if p.fits]
  if not fitting:
    return min(plans, key=lambda p: p.bytes)
  return max(fitting, key=lambda p: (p.micro_batch, not p.remat, -p.bytes))


def describe(p: Plan, device_bytes: int) -> str:
  return (f"{'fits' if p.fits else 'does not fit'}: mesh data,fsdp,tensor,expert = {tuple(p.mesh)}, micro-batch "
          f"{p.micro_batch}, remat {'on' if p.remat else 'off'}, {p.bytes / GIB:.1f} GiB per device (of "
          f"{FIT_FRACTION * device_bytes / GIB:.1f} usable)")


# The docs/models.md tables of plans: name -> (models, accelerators).
PLAN_TABLES = {"moe": (("qwen3-30b-a3b", "gpt-oss-20b"), ACCELERATORS),
               "hybrid": (("qwen3.5-0.8b", "qwen3.5-27b"), H100),
               "gemma4": (("gemma4-e2b", "gemma4-31b"), H100)}


def plan_table(which: str) -> str:
  """A docs/models.md table: the plans of PLAN_TABLES[which]'s models on its accelerators, MOE_WORKLOAD, bf16
  compute, both parameter dtypes, with and without a reference copy."""
  names, accelerators = PLAN_TABLES[which]
  lines = ["| model | accelerator | params | beta | fits | mesh (data,fsdp,tensor,expert) | micro-batch | remat | "
           "GiB per device (usable) |", "|" + "---|" * 9]
  for name in names:
    cfg = model_config(name, "bfloat16", "bfloat16")
    active = f", {active_params(cfg) / 1e9:.2f}B active" if cfg.num_experts else ""
    label = f"{name} ({param_elements(cfg, Mesh(1, 1, 1))[0] / 1e9:.2f}B{active})"
    for accelerator, (devices, device_bytes) in accelerators.items():
      for pdt in ("bfloat16", "float32"):
        for beta, use_ref in (("0", False), ("0.04", True)):
          p = plan(model_config(name, pdt, "bfloat16"), devices, device_bytes, MOE_WORKLOAD._replace(use_ref=use_ref))
          lines.append(f"| {label} | {accelerator} | {pdt} | {beta} | {'yes' if p.fits else '**no**'} | "
                       f"{tuple(p.mesh)} | {p.micro_batch} | {'on' if p.remat else 'off'} | {p.bytes / GIB:.1f} "
                       f"({FIT_FRACTION * device_bytes / GIB:.1f}) |")
  return "\n".join(lines)


def main(argv=None):
  exit_on_mistake("memory_estimate", lambda: run(argv))


def run(argv=None):
  p = argparse.ArgumentParser(prog="memory_estimate", description=__doc__.split("\n\n")[0])
  src = p.add_mutually_exclusive_group()
  src.add_argument("--model", choices=sorted(PRESETS), help="a named preset")
  src.add_argument("--hf-config", help="a Hugging Face config.json (or its directory)")
  src.add_argument("--table", nargs="?", const="qwen", choices=("qwen", "gemma3", *PLAN_TABLES),
                   help="print the docs/scaling.md table (qwen) or a docs/models.md one (gemma3, moe, hybrid, "
                   "gemma4)")
  p.add_argument("--mesh", default="1,1,1", help="data,fsdp,tensor[,expert] (default 1,1,1)")
  p.add_argument("--plan", action="store_true", help="search meshes, micro-batch and remat for --devices devices "
                 "of --device-memory-gib each instead of --mesh and --micro-batch")
  p.add_argument("--devices", type=int, default=8, help="--plan's device count (default 8)")
  p.add_argument("--device-memory-gib", type=float, default=81559 / 1024, help="memory per device (default: an "
                 "H100 80GB's 79.6 GiB); a plan uses at most FIT_FRACTION = 0.76 of it")
  p.add_argument("--group-size", type=int, default=16, help="G, completions per prompt (--plan's prompt repeats)")
  p.add_argument("--param-dtype", default="float32", choices=sorted(DTYPE_BYTES))
  p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES), help="compute dtype")
  p.add_argument("--sampler-batch", type=int, default=Workload._field_defaults['sampler_batch'])
  p.add_argument("--prompt-len", type=int, default=Workload._field_defaults['prompt_len'])
  p.add_argument("--new-tokens", type=int, default=Workload._field_defaults['new_tokens'])
  p.add_argument("--micro-batch", type=int, default=0, help="global rows per forward/backward (0: one per "
                 "data x fsdp device)")
  p.add_argument("--logprob-chunk", type=int, default=Workload._field_defaults['logprob_chunk'])
  p.add_argument("--no-ref", action="store_true", help="beta = 0: no reference parameters")
  p.add_argument("--offload-ref", action="store_true", help="reference parameters in host memory")
  p.add_argument("--prompt-repeats", type=int, default=1, help="rows per prompt forward in the update "
                 "(model.share_prompt_forward: gcd(micro-batch, G); 1: every row runs its own prompt)")
  p.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank (model.lora_rank; 0: full "
                 "fine-tuning)")
  p.add_argument("--lora-targets", default="all", help="model.lora_targets (default all)")
  args = p.parse_args(argv)
  if args.table in PLAN_TABLES:
    print(plan_table(args.table))
    return
  if args.table:
    names = ["params", "grads", "AdamW", "ref", "KV cache", "act.", "act. remat", "total", "total remat"]  # COLUMNS
    print("| model, mesh (data,fsdp,tensor), dtype | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1))
    for name, mesh, pdt, w in (GEMMA3_TABLE if args.table == "gemma3" else TABLE):
      est = estimate(model_config(name, pdt, "bfloat16"), mesh, w)
      extra = ", ref offloaded" if w.offload_ref else ""
      if w.lora_rank:
        extra += f", LoRA r{w.lora_rank}"
      if w.sampler_batch != Workload._field_defaults["sampler_batch"] and args.table == "qwen":
        extra += f" (sampler batch {w.sampler_batch})"
      print(f"| {name} ({est['num_params'] / 1e9:.2f}B), {tuple(mesh)[:3]}, {pdt}{extra} | "
            + " | ".join(f"{est[c] / GIB:.2f}" for c in COLUMNS) + " |")
    return
  if not (args.model or args.hf_config):
    p.error("give --model, --hf-config or --table")
  try:
    sizes = [int(x) for x in args.mesh.split(",")]
    if len(sizes) not in (3, 4):
      raise ValueError
    mesh = Mesh(*sizes)
  except ValueError:
    p.error(f"--mesh {args.mesh!r}: expected three or four integers data,fsdp,tensor[,expert]")
  cfg = model_config(args.model or args.hf_config, args.param_dtype, args.dtype)
  w = Workload(sampler_batch=args.sampler_batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
               micro_batch=args.micro_batch, logprob_chunk=args.logprob_chunk, use_ref=not args.no_ref,
               offload_ref=args.offload_ref, prompt_repeats=args.prompt_repeats, lora_rank=args.lora_rank,
               lora_targets=args.lora_targets)
  if max(cfg.num_experts, 1) % mesh.expert:
    p.error(f"--mesh {args.mesh!r}: expert={mesh.expert} does not divide the model's {cfg.num_experts} experts")
  if args.plan:
    device_bytes = int(args.device_memory_gib * GIB)
    chosen = plan(cfg, args.devices, device_bytes, w, args.group_size)
    print(f"plan for {args.devices} devices of {args.device_memory_gib:.1f} GiB: {describe(chosen, device_bytes)}")
    mesh, w = chosen.mesh, w._replace(micro_batch=chosen.micro_batch,
                                      prompt_repeats=math.gcd(chosen.micro_batch, args.group_size))
  est = estimate(cfg, mesh, w)
  active = f" ({active_params(cfg) / 1e9:.3f}B active)" if cfg.num_experts else ""
  print(f"{args.model or args.hf_config}: {est['num_params'] / 1e9:.3f}B parameters{active}; mesh data,fsdp,tensor,"
        f"expert = {tuple(mesh)} ({math.prod(mesh)} devices); params {args.param_dtype}, compute {args.dtype}")
  print(f"workload: sampler batch {w.sampler_batch} x ({w.prompt_len} + {w.new_tokens}) tokens, micro-batch "
        f"{w.micro_batch or mesh.batch_ways} rows, log-prob chunk {w.logprob_chunk}, prompt repeats "
        f"{w.prompt_repeats}")
  if w.lora_rank:
    print(f"LoRA rank {w.lora_rank} on {w.lora_targets}: {est['trainable'] / 1e6:.2f}M trainable parameters "
          f"({100 * est['trainable'] / est['num_params']:.2f}%)")
  for k in COLUMNS:
    print(f"  {k:18s} {est[k] / GIB:9.2f} GiB per device")


if __name__ == "__main__":
  main()
