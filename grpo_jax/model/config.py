"""Model configuration for the Llama / Qwen2 / Qwen3 decoder family.

`ModelConfig` is a frozen dataclass (hashable, so it can be a static jit argument). It is built either by
hand (tests, the tiny default experiment) or from a Hugging Face `config.json` (`from_hf_config`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


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

  def __post_init__(self):
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: expected one of {sorted(DTYPES)}")
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


SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def from_hf_config(hf: Mapping[str, Any], **overrides) -> ModelConfig:
  """Builds a ModelConfig from a Hugging Face config.json dict; unsupported options raise ValueError."""
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  if model_type not in ("llama", "qwen2", "qwen3"):
    raise ValueError(f"config.json: model_type={model_type!r} is not supported "
                     f"(supported: llama, qwen2, qwen3; architectures={archs})")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"config.json: hidden_act={hf.get('hidden_act')!r} is not supported (only 'silu')")
  num_heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
  rope_scaling = None
  rs = hf.get("rope_scaling")
  # transformers 5 may store rope settings under `rope_parameters`.
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
      raise ValueError(f"config.json: rope_scaling type {rtype!r} is not supported (only 'llama3')")
  if model_type == "qwen2":
    if hf.get("use_sliding_window", False):
      raise ValueError("config.json: use_sliding_window=True is not supported")
    attention_bias = True
  else:
    attention_bias = bool(hf.get("attention_bias", False))
  if model_type == "llama" and hf.get("mlp_bias", False):
    raise ValueError("config.json: mlp_bias=True is not supported")
  if model_type == "qwen3" and hf.get("use_sliding_window", False):
    raise ValueError("config.json: use_sliding_window=True is not supported")
  kw = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
      num_heads=num_heads, num_kv_heads=hf.get("num_key_value_heads") or num_heads, head_dim=head_dim,
      max_position_embeddings=hf.get("max_position_embeddings", 2048), rope_theta=float(rope_theta),
      rope_scaling=rope_scaling, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), attention_bias=attention_bias,
      qk_norm=(model_type == "qwen3"))
  kw.update(overrides)
  return ModelConfig(**kw)
