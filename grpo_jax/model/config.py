"""Model configuration for the Llama / Qwen2 / Qwen3 decoder family.

`ModelConfig` is a frozen dataclass (hashable, so it can be a static jit argument). It is built either by
hand (tests, the tiny default experiment) or from a Hugging Face `config.json` (`from_hf_config`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# How the full-sequence forward (the update, reference and old log-probs) computes attention; the sampler's
# KV-cache steps always use "einsum". "einsum": grpo_jax's own grouped-query einsums (float32 scores);
# "jax": jax.nn.dot_product_attention's XLA implementation (the same math); "cudnn": its cuDNN flash-attention
# kernel on NVIDIA GPUs (bfloat16/float16 compute), which never materializes the [T, S] score matrix.
ATTENTION = ("einsum", "jax", "cudnn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 style frequency scaling (`rope_type: llama3` in config.json)."""
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


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
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = False   # Qwen2: bias on q/k/v projections.
  qk_norm: bool = False          # Qwen3: RMSNorm over head_dim on q and k.
  param_dtype: str = "float32"
  dtype: str = "float32"         # compute dtype of activations and matmuls.
  remat: bool = False            # jax.checkpoint each decoder layer.
  attention: str = "einsum"      # one of ATTENTION
  family: str = "llama"          # HF model_type written by save_pretrained: llama, qwen2 or qwen3.

  def __post_init__(self):
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: expected one of {sorted(DTYPES)}")
    if self.attention not in ATTENTION:
      raise ValueError(f"ModelConfig.attention={self.attention!r}: expected one of {list(ATTENTION)}")
    if self.attention == "cudnn" and self.dtype not in ("bfloat16", "float16"):
      raise ValueError(f"ModelConfig.attention='cudnn' needs dtype bfloat16 or float16 (cuDNN flash attention), "
                       f"got dtype={self.dtype!r}")
    if self.family not in FAMILIES:
      raise ValueError(f"ModelConfig.family={self.family!r}: expected one of {sorted(FAMILIES)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"ModelConfig: num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)


# HF model_type -> architecture class name.
FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES.values())
# Families users ask for, with what their layers do that the Llama-style decoder here does not.
NOT_YET_SUPPORTED = {
    "gemma3_text": "Gemma 3 scales RMSNorm by (1 + weight), multiplies embeddings by sqrt(hidden_size), scales "
                   "queries by query_pre_attn_scalar, normalizes before and after both attention and MLP (four "
                   "norms per layer), uses GeGLU (gelu_pytorch_tanh), and alternates sliding-window layers (with "
                   "their own RoPE base) with global ones",
    "gemma2": "Gemma 2 has Gemma 3's differences (without q/k norms) plus logit soft-capping in attention and at "
              "the output",
    "mistral": "Mistral's sliding-window attention",
}
NOT_YET_SUPPORTED["gemma3"] = NOT_YET_SUPPORTED["gemma3_text"]


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
  if hf.get("hidden_act", "silu") != "silu":
    _unsupported(f"hidden_act={hf.get('hidden_act')!r} is not supported (only 'silu')")
  num_heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
  rope_scaling = None
  rs = hf.get("rope_scaling")
  # transformers 5 stores rope settings (theta included) under `rope_parameters`.
  rp = hf.get("rope_parameters") or {}
  if rs is None and rp.get("rope_type", "default") != "default":
    rs = rp
  rope_theta = hf.get("rope_theta", rp.get("rope_theta", 10000.0))
  if rs:
    rtype = rs.get("rope_type", rs.get("type"))
    if rtype == "llama3":
      rope_scaling = RopeScaling(float(rs["factor"]), float(rs["low_freq_factor"]),
                                 float(rs["high_freq_factor"]), int(rs["original_max_position_embeddings"]))
    elif rtype not in (None, "default"):
      _unsupported(f"rope scaling type {rtype!r} is not supported (only 'llama3')")
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
      qk_norm=(model_type == "qwen3"), family=model_type)
  kw.update(overrides)
  return ModelConfig(**kw)


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json dict of `cfg` for transformers' `cfg.family` architecture (inverse of from_hf_config)."""
  wants_bias, wants_qk_norm = cfg.family == "qwen2", cfg.family == "qwen3"
  if cfg.attention_bias != wants_bias or cfg.qk_norm != wants_qk_norm:
    raise ValueError(
        f"ModelConfig(family={cfg.family!r}, attention_bias={cfg.attention_bias}, qk_norm={cfg.qk_norm}) has "
        f"no Hugging Face equivalent: llama has neither, qwen2 has attention_bias only, qwen3 has qk_norm "
        f"only; set `family` accordingly")
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  legacy_scaling = None
  if cfg.rope_scaling is not None:
    rs = cfg.rope_scaling
    legacy_scaling = {"rope_type": "llama3", "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
                      "high_freq_factor": rs.high_freq_factor,
                      "original_max_position_embeddings": rs.original_max_position_embeddings}
    rope.update(legacy_scaling)
  hf = {
      "architectures": [FAMILIES[cfg.family]],
      "model_type": cfg.family,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": cfg.max_position_embeddings,
      "rms_norm_eps": cfg.rms_norm_eps,
      "tie_word_embeddings": cfg.tie_word_embeddings,
      # transformers >= 5 reads rope_parameters; rope_theta / rope_scaling keep older readers correct.
      "rope_parameters": rope,
      "rope_theta": cfg.rope_theta,
      "rope_scaling": legacy_scaling,
      "attention_dropout": 0.0,
      "dtype": cfg.param_dtype,
  }
  if cfg.family == "llama":
    hf.update(attention_bias=False, mlp_bias=False)
  elif cfg.family == "qwen3":
    hf.update(attention_bias=False, use_sliding_window=False)
  else:
    hf.update(use_sliding_window=False)
  return hf
