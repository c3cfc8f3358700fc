"""Decoder-only transformer (Llama / Qwen2 / Qwen3 family) in Flax NNX.

Shape suffixes: B batch, T query length, S key length (cache length when decoding), D hidden size,
N query heads, K kv heads, H head dim, F MLP hidden size, V vocabulary.

Parameters carry logical axis names (see `grpo_jax/model/sharding.py` for the rules mapping them to mesh axes):
  'vocab', 'embed', 'q_heads', 'kv_heads', 'head_dim', 'mlp', 'norm'.

Masks are explicit: `attn_mask_BxTxS` is True where query t may attend to key s. The caller builds it
(causal & key-is-not-padding), which lets the same code serve training (S = T) and cached decoding
(S = cache length, keys written at `cache_index`).

KV cache layout: keys [B, K, H, S], values [B, K, S, H]. The kv-head axis comes before the slot axis so the
attention dots read the cache in place (with [B, S, K, H], XLA on CPU copied every layer's whole cache into
a transposed layout at every decode step). Keys are stored transposed, slots last, so that both decode dots,
q @ K and p @ V, contract the cache over its second-minor axis: with keys as [B, K, S, H], the q @ K^T dot
repacked the cache at every step and a layer's attention took ~2x as long on CPU (265 vs 140 us per layer
at B=32, S=96 in a micro-benchmark).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax.model.config import ModelConfig


class LayerCache(NamedTuple):
  k_BxKxHxS: jax.Array
  v_BxKxSxH: jax.Array


def init_cache(cfg: ModelConfig, batch: int, length: int) -> list[LayerCache]:
  """One zero `LayerCache` per layer in the model dtype: keys [batch, num_kv_heads, head_dim, length],
  values [batch, num_kv_heads, length, head_dim]."""
  B, K, H, S = batch, cfg.num_kv_heads, cfg.head_dim, length
  return [LayerCache(jnp.zeros((B, K, H, S), cfg.jnp_dtype), jnp.zeros((B, K, S, H), cfg.jnp_dtype))
          for _ in range(cfg.num_layers)]


def _normal(stddev: float):
  """N(0, stddev²) initializer. Drawn as a flat vector and reshaped: XLA:CPU compiles the 1-D threefry program
  several times faster than an N-D one, and eager model construction compiles one per parameter shape."""
  def init(key, shape, dtype):
    return (stddev * jax.random.normal(key, (math.prod(shape),), jnp.float32)).astype(dtype).reshape(shape)
  return init


def _param(rngs: nnx.Rngs, init, shape, names, dtype):
  return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):
  def __init__(self, dim: int, eps: float, dtype, *, rngs: nnx.Rngs):
    del rngs
    self.scale = nnx.Param(jnp.ones((dim,), dtype), out_sharding=("norm",), eager_sharding=False)
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
  """[H/2] inverse frequencies, with Llama-3 scaling when configured."""
  inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim))
  rs = cfg.rope_scaling
  if rs is None:
    return inv
  low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
  high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = jnp.where(wavelen > low_wavelen, inv / rs.factor, inv)
  smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
      rs.high_freq_factor - rs.low_freq_factor)
  smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def rope_tables(positions_BxT, inv_freq_Hh):
  """(cos, sin) of the rotary angles, each [B, T, 1, H/2] float32 (`Transformer.__call__`'s `rope_cos_sin`)."""
  angles = positions_BxT[..., None].astype(jnp.float32) * inv_freq_Hh
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def apply_rope(x_BxTxNxH, cos_sin):
  """Rotary embedding in the 'rotate half' layout used by Hugging Face Llama/Qwen checkpoints."""
  cos, sin = cos_sin
  x = x_BxTxNxH.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


def _attend(q, k, v, attn_mask_BxTxS, spec: str, dt):
  """Grouped-query softmax attention. `spec` = "<q axes>,<k axes>,<v axes>" over the letters b, t, k (kv
  head), g (query head within its group), h, s; the result has q's axes."""
  q_spec, k_spec, v_spec = spec.split(",")
  logits = jnp.einsum(f"{q_spec},{k_spec}->bkgts", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
  logits = jnp.where(attn_mask_BxTxS[:, None, None, :, :], logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  return jnp.einsum(f"bkgts,{v_spec}->{q_spec}", probs, v)


def _library_attention(q_BxTxKxGxH, k_BxSxKxH, v_BxSxKxH, attn_mask_BxTxS, attention: str):
  """`jax.nn.dot_product_attention` (XLA, or cuDNN flash attention for attention="cudnn"); [B, T, K, G, H].
  Query head n uses key/value head n // G in both this module and that function."""
  B, T, K, G, H = q_BxTxKxGxH.shape
  out = jax.nn.dot_product_attention(q_BxTxKxGxH.reshape(B, T, K * G, H), k_BxSxKxH, v_BxSxKxH,
                                     mask=attn_mask_BxTxS[:, None],
                                     implementation="cudnn" if attention == "cudnn" else "xla")
  return out.reshape(B, T, K, G, H)


class Attention(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pd = cfg.jnp_param_dtype
    init = _normal(0.02)
    self.q_DxNxH = _param(rngs, init, (D, N, H), ("embed", "q_heads", "head_dim"), pd)
    self.k_DxKxH = _param(rngs, init, (D, K, H), ("embed", "kv_heads", "head_dim"), pd)
    self.v_DxKxH = _param(rngs, init, (D, K, H), ("embed", "kv_heads", "head_dim"), pd)
    self.o_NxHxD = _param(rngs, init, (N, H, D), ("q_heads", "head_dim", "embed"), pd)
    if cfg.attention_bias:
      self.q_bias_NxH = nnx.Param(jnp.zeros((N, H), pd), out_sharding=("q_heads", "head_dim"), eager_sharding=False)
      self.k_bias_KxH = nnx.Param(jnp.zeros((K, H), pd), out_sharding=("kv_heads", "head_dim"), eager_sharding=False)
      self.v_bias_KxH = nnx.Param(jnp.zeros((K, H), pd), out_sharding=("kv_heads", "head_dim"), eager_sharding=False)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(H, cfg.rms_norm_eps, pd, rngs=rngs)
      self.k_norm = RMSNorm(H, cfg.rms_norm_eps, pd, rngs=rngs)
    self.adapters = nnx.data(None)  # LoRA: a lora.LayerAdapters attached by lora.add_adapters

  def __call__(self, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache: LayerCache | None, cache_index):
    cfg = self.cfg
    dt = cfg.jnp_dtype
    q = jnp.einsum("btd,dnh->btnh", x_BxTxD, self.q_DxNxH[...].astype(dt))
    k = jnp.einsum("btd,dkh->btkh", x_BxTxD, self.k_DxKxH[...].astype(dt))
    v = jnp.einsum("btd,dkh->btkh", x_BxTxD, self.v_DxKxH[...].astype(dt))
    if self.adapters is not None:
      q = self.adapters.add("q_proj", x_BxTxD, q)
      k = self.adapters.add("k_proj", x_BxTxD, k)
      v = self.adapters.add("v_proj", x_BxTxD, v)
    if cfg.attention_bias:
      q = q + self.q_bias_NxH[...].astype(dt)
      k = k + self.k_bias_KxH[...].astype(dt)
      v = v + self.v_bias_KxH[...].astype(dt)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = apply_rope(q, rope_cos_sin)
    k = apply_rope(k, rope_cos_sin)

    B, T, N, H = q.shape
    K = cfg.num_kv_heads
    q = q.reshape(B, T, K, N // K, H)
    new_cache = None
    if cache is None and cfg.attention != "einsum":
      out = _library_attention(q, k, v, attn_mask_BxTxS, cfg.attention)
    elif cache is None:  # training: keys/values as projected, [B, S=T, K, H]
      out = _attend(q, k, v, attn_mask_BxTxS, "btkgh,bskh,bskh", dt)
    else:
      # The T new keys/values are small; moving their axes (not the cache's) keeps the cache layout fixed
      # across decode steps. The query is put in [B, K, G, T, H] too, so that both dots are batched over
      # (B, K) with every operand and result in place; with q as [B, T, K, G, H] XLA on CPU swapped the dot
      # operands for T = 1 and decoding ran ~30% slower.
      cache_dt = cache.v_BxKxSxH.dtype
      k_new_BxKxHxT = jnp.transpose(k, (0, 2, 3, 1)).astype(cache_dt)
      k_all = jax.lax.dynamic_update_slice_in_dim(cache.k_BxKxHxS, k_new_BxKxHxT,
                                                  cache_index, axis=3)
      v_all = jax.lax.dynamic_update_slice_in_dim(cache.v_BxKxSxH, jnp.swapaxes(v, 1, 2).astype(cache_dt),
                                                  cache_index, axis=2)
      new_cache = LayerCache(k_all, v_all)
      if T > 1 and cfg.attention != "einsum":  # a prefill, or a training forward over a shared prompt's cache
        out = _library_attention(q, jnp.transpose(k_all, (0, 3, 1, 2)).astype(dt),
                                 jnp.swapaxes(v_all, 1, 2).astype(dt), attn_mask_BxTxS, cfg.attention)
      else:
        out = _attend(jnp.moveaxis(q, 1, 3), k_all.astype(dt), v_all.astype(dt), attn_mask_BxTxS,
                      "bkgth,bkhs,bksh", dt)
        out = jnp.moveaxis(out, 3, 1)
    # Flattening both (n, h) axes by hand keeps the contraction a plain [B*T, N*H] x [N*H, D] matmul; from the
    # einsum XLA chose (h, n) order and transposed the weight matrix at every decode step.
    out = out.reshape(B, T, N * H)
    y = out @ self.o_NxHxD[...].reshape(N * H, -1).astype(dt)
    if self.adapters is not None:
      y = self.adapters.add("o_proj", out, y)
    return y, new_cache


class MLP(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, F, pd = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_param_dtype
    init = _normal(0.02)
    self.gate_DxF = _param(rngs, init, (D, F), ("embed", "mlp"), pd)
    self.up_DxF = _param(rngs, init, (D, F), ("embed", "mlp"), pd)
    self.down_FxD = _param(rngs, init, (F, D), ("mlp", "embed"), pd)
    self.adapters = nnx.data(None)  # LoRA: a lora.LayerAdapters attached by lora.add_adapters

  def __call__(self, x_BxTxD):
    dt = self.cfg.jnp_dtype
    gate = x_BxTxD @ self.gate_DxF[...].astype(dt)
    up = x_BxTxD @ self.up_DxF[...].astype(dt)
    if self.adapters is None:
      return (jax.nn.silu(gate) * up) @ self.down_FxD[...].astype(dt)
    gate = self.adapters.add("gate_proj", x_BxTxD, gate)
    up = self.adapters.add("up_proj", x_BxTxD, up)
    hidden = jax.nn.silu(gate) * up
    return self.adapters.add("down_proj", hidden, hidden @ self.down_FxD[...].astype(dt))


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    pd = cfg.jnp_param_dtype
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache, cache_index):
    h, new_cache = self.attn(self.input_norm(x_BxTxD), rope_cos_sin, attn_mask_BxTxS, cache, cache_index)
    x_BxTxD = x_BxTxD + h
    x_BxTxD = x_BxTxD + self.mlp(self.post_attn_norm(x_BxTxD))
    return x_BxTxD, new_cache


def _rematerialized(layer: DecoderLayer, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache: LayerCache | None,
                    cache_index):
  """`layer(x, ...)` -> (x, new_cache), its activations recomputed in the backward pass instead of stored.

  `jax.checkpoint` of a pure function of the layer's split state: `nnx.remat` on the module itself raised
  "Cannot mutate Param from a different trace level" under `jax.value_and_grad` of merged parameters (the
  update's pattern). Only the layer's inputs (and its cache, when given) are saved for the backward pass
  (tests/model/test_remat.py). XLA:CPU merges the recomputation back into the forward pass, so on a CPU remat
  saves no memory; GPUs and TPUs keep it.
  """
  graphdef, state = nnx.split(layer)

  def forward(state, x, cos_sin, mask, cache):
    return nnx.merge(graphdef, state)(x, cos_sin, mask, cache, cache_index)

  return jax.checkpoint(forward)(state, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache)


class Transformer(nnx.Module):
  """`__call__` returns final-norm hidden states [B,T,D]; `logits(hidden)` projects to the vocabulary."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.jnp_param_dtype
    self.embed_VxD = _param(rngs, _normal(0.02), (cfg.vocab_size, cfg.hidden_size),
                            ("vocab", "embed"), pd)
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
    if not cfg.tie_word_embeddings:
      self.lm_head_DxV = _param(rngs, _normal(0.02), (cfg.hidden_size, cfg.vocab_size),
                                ("embed", "vocab"), pd)

  def __call__(self, tokens_BxT, positions_BxT, attn_mask_BxTxS, cache: list[LayerCache] | None = None,
               cache_index=0, rope_cos_sin=None, remat: bool | None = None):
    """Returns (hidden_BxTxD, new_cache or None). With a cache, keys/values are written at `cache_index`.

    `remat`: rematerialize each layer in the backward pass; None means `cfg.remat` without a cache (the
    sampler's cached decoding takes no gradients) and a training forward through a cache passes it explicitly.

    `rope_cos_sin`: `self.rope_tables(positions_BxT)` computed by the caller, who may then pass None as the
    positions. A decode loop computes every step's tables once before the loop: inside it, XLA fused the
    cos/sin evaluation into each layer's kernels (8 copies per step for 4 layers).
    """
    x = jnp.take(self.embed_VxD[...], tokens_BxT, axis=0).astype(self.cfg.jnp_dtype)
    if rope_cos_sin is None:
      rope_cos_sin = self.rope_tables(positions_BxT)
    if remat is None:
      remat = self.cfg.remat and cache is None
    new_cache = [] if cache is not None else None
    for i, layer in enumerate(self.layers):
      layer_cache = cache[i] if cache is not None else None
      if remat:
        x, c = _rematerialized(layer, x, rope_cos_sin, attn_mask_BxTxS, layer_cache, cache_index)
      else:
        x, c = layer(x, rope_cos_sin, attn_mask_BxTxS, layer_cache, cache_index)
      if cache is not None:
        new_cache.append(c)
    return self.final_norm(x), new_cache

  def rope_tables(self, positions_BxT):
    """(cos, sin), each [B, T, 1, H/2] float32: the rotary tables for these positions."""
    return rope_tables(positions_BxT, rope_inv_freq(self.cfg))

  def output_matrix_DxV(self) -> jax.Array:
    if self.cfg.tie_word_embeddings:
      return self.embed_VxD[...].T
    return self.lm_head_DxV[...]

  def logits(self, hidden_BxTxD) -> jax.Array:
    """float32 logits [B,T,V]. For log-probs over a large vocabulary use `logprobs.token_logprobs`."""
    return jnp.einsum("btd,dv->btv", hidden_BxTxD, self.output_matrix_DxV().astype(hidden_BxTxD.dtype),
                      preferred_element_type=jnp.float32)
