"""Decoder-only transformer (Llama / Qwen2 / Qwen3 / Gemma 3, Qwen3-MoE / gpt-oss, Qwen3.5 families) in Flax NNX.

Shape suffixes: B batch, T query length, S key length (cache length when decoding), D hidden size,
N query heads, K kv heads, H head dim, F MLP hidden size, V vocabulary.

Parameters carry logical axis names (see `grpo_jax/model/sharding.py` for the rules mapping them to mesh axes):
  'vocab', 'embed', 'q_heads', 'kv_heads', 'head_dim', 'mlp', 'norm'.

Masks are explicit: `attn_mask_BxTxS` is True where query t may attend to key s. The caller builds it
(causal & key-is-not-padding), which lets the same code serve training (S = T) and cached decoding
(S = cache length, keys written at `cache_index`). That mask is the one of global (full-attention) layers; the
model derives the sliding-window layers' mask from it (`_sliding_mask`), reading key and query indices as
slots (the sampler's and the trainer's layout: left padding, then one token per slot, so that index
differences are position differences).

Gemma 3 (`cfg.gemma`, details in config.ModelConfig.gemma): checked against transformers'
Gemma3ForCausalLM (tests/model/test_gemma3.py). Its sliding layers keep a ring buffer of
W = min(sliding_window, cache length) slots as their KV cache: the key at index i sits in slot i mod W.

KV cache layout: keys [B, K, H, S], values [B, K, S, H]. The kv-head axis comes before the slot axis so the
attention dots read the cache in place (with [B, S, K, H], XLA on CPU copied every layer's whole cache into
a transposed layout at every decode step). Keys are stored transposed, slots last, so that both decode dots,
q @ K and p @ V, contract the cache over its second-minor axis: with keys as [B, K, S, H], the q @ K^T dot
repacked the cache at every step and a layer's attention took ~2x as long on CPU (265 vs 140 us per layer
at B=32, S=96 in a micro-benchmark). Qwen3.5's linear-attention layers keep a fixed-size
`linear_attention.LinearCache` instead (a convolution window and a recurrent state per row).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax.model.config import FULL, LINEAR, SLIDING, LinearRopeScaling, ModelConfig, YarnRopeScaling
from grpo_jax.model.decode_attention import decode_attention
from grpo_jax.model.initializers import normal as _normal, param as _param
from grpo_jax.model.linear_attention import GatedDeltaNet, LinearCache, init_linear_cache
from grpo_jax.model.moe import MoE


class LayerCache(NamedTuple):
  k_BxKxHxS: jax.Array
  v_BxKxSxH: jax.Array


def cache_slots(cfg: ModelConfig, layer: int, length: int) -> int:
  """Slots of layer `layer`'s cache for a cache of `length` positions: `length`, or for a sliding-window layer
  min(sliding_window, length) (a ring buffer)."""
  return min(cfg.sliding_window, length) if cfg.is_sliding(layer) else length


def init_cache(cfg: ModelConfig, batch: int, length: int) -> list[LayerCache | LinearCache]:
  """One zero `LayerCache` per attention layer in the model dtype: keys [batch, num_kv_heads, head_dim, slots],
  values [batch, num_kv_heads, slots, head_dim], slots = `cache_slots(cfg, layer, length)`; a `LinearCache` per
  linear-attention layer (its size independent of `length`)."""
  B, K, H = batch, cfg.num_kv_heads, cfg.head_dim
  kv = lambda S: LayerCache(jnp.zeros((B, K, H, S), cfg.jnp_dtype), jnp.zeros((B, K, S, H), cfg.jnp_dtype))
  return [init_linear_cache(cfg, B) if cfg.is_linear(i) else kv(cache_slots(cfg, i, length))
          for i in range(cfg.num_layers)]


def attention_caches(cache: list) -> list[LayerCache]:
  """The KV caches of a model's cache (its attention layers')."""
  return [c for c in cache if isinstance(c, LayerCache)]


def extend_cache(cfg: ModelConfig, cache: list[LayerCache], extra: int) -> list[LayerCache]:
  """A cache of `length` positions (all written) grown to `length + extra`: global layers get `extra` empty
  slots; a ring that holds fewer than sliding_window slots never wrapped (slot = index), so it grows the same
  way, up to sliding_window slots."""
  out = []
  for i, c in enumerate(cache):
    if isinstance(c, LinearCache):  # fixed size
      out.append(c)
      continue
    S = c.v_BxKxSxH.shape[2]
    pad = min(cfg.sliding_window, S + extra) - S if cfg.is_sliding(i) else extra
    out.append(LayerCache(jnp.pad(c.k_BxKxHxS, ((0, 0), (0, 0), (0, 0), (0, pad))),
                          jnp.pad(c.v_BxKxSxH, ((0, 0), (0, 0), (0, pad), (0, 0)))))
  return out


def cast_for_compute(state, cfg: ModelConfig):
  """`state` with every parameter of two or more dimensions (projections, embeddings, biases, adapters) cast to
  the compute dtype, which is what the forward casts each of them to at every use; vectors (norm scales, applied
  in float32) are left as they are. The forward computes the same values from either state. A decode loop given
  the cast state reads bfloat16 weights at each token step instead of the float32 master weights (half the
  bytes): XLA does not hoist the casts out of a while loop by itself."""
  dt, pd = cfg.jnp_dtype, cfg.jnp_param_dtype
  if dt == pd:
    return state
  return jax.tree.map(lambda x: x.astype(dt) if x.ndim >= 2 and x.dtype == pd else x, state)


class RMSNorm(nnx.Module):
  """x / rms(x) * scale in float32, cast back to x's dtype. `offset` (Gemma): the stored weight w is an offset
  from 1 (initialized to 0) and the scale is 1 + w, as in the checkpoints."""

  def __init__(self, dim: int, eps: float, dtype, *, rngs: nnx.Rngs, offset: bool = False):
    del rngs
    self.scale = nnx.Param((jnp.zeros if offset else jnp.ones)((dim,), dtype), out_sharding=("norm",),
                           eager_sharding=False)
    self.eps = eps
    self.offset = offset

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    scale = self.scale[...].astype(jnp.float32)
    return (y * (1.0 + scale if self.offset else scale)).astype(x.dtype)


def _yarn_inv_freq(inv, rs: YarnRopeScaling, theta: float, dim: int):
  """YaRN's blend (transformers' _compute_yarn_parameters): dimensions that turn fewer than beta_slow times over
  the original context are interpolated (inv / factor), those that turn more than beta_fast times kept, a linear
  ramp between."""
  def correction_dim(rotations):
    return dim * math.log(rs.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))
  low, high = correction_dim(rs.beta_fast), correction_dim(rs.beta_slow)
  if rs.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low if high > low else 0.001), 0, 1)
  return inv / rs.factor * ramp + inv * (1 - ramp)


def rope_attention_factor(cfg: ModelConfig) -> float:
  """What cos and sin are multiplied by: YaRN's attention factor, else 1."""
  rs = cfg.rope_scaling
  if not isinstance(rs, YarnRopeScaling):
    return 1.0
  return rs.attention_factor or (0.1 * math.log(rs.factor) + 1.0 if rs.factor > 1 else 1.0)


def rope_inv_freq(cfg: ModelConfig, sliding: bool = False) -> jax.Array:
  """[R/2] inverse frequencies (R = cfg.rotary_dim) of global layers (rope_theta, with rope_scaling when
  configured) or of Gemma 3's sliding layers (local_rope_theta, unscaled); gpt-oss's sliding layers use the
  global ones."""
  theta = cfg.local_rope_theta if sliding else cfg.rope_theta
  dim = cfg.rotary_dim
  inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  rs = None if sliding else cfg.rope_scaling
  if rs is None:
    return inv
  if isinstance(rs, LinearRopeScaling):
    return inv / rs.factor
  if isinstance(rs, YarnRopeScaling):
    return _yarn_inv_freq(inv, rs, theta, dim)
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
  """(cos, sin) of the rotary angles, each [B, T, 1, R/2] float32 (`Transformer.__call__`'s `rope_cos_sin`)."""
  angles = positions_BxT[..., None].astype(jnp.float32) * inv_freq_Hh
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def apply_rope(x_BxTxNxH, cos_sin):
  """Rotary embedding in the 'rotate half' layout used by Hugging Face Llama/Qwen checkpoints, on the first R
  dimensions of each head (R = 2 x the tables' last axis); the others pass unrotated (partial RoPE)."""
  cos, sin = cos_sin
  R = 2 * cos.shape[-1]
  x = x_BxTxNxH.astype(jnp.float32)
  x1, x2 = jnp.split(x[..., :R], 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., R:]], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


def _attend(q, k, v, attn_mask_BxTxS, spec: str, dt, scale: float, sinks_KxQ=None):
  """Grouped-query softmax attention, scores times `scale`. `spec` = "<q axes>,<k axes>,<v axes>" over the
  letters b, t, k (kv head), g (query head within its group), h, s; the result has q's axes. `sinks_KxQ`
  (gpt-oss): one more logit per query head in the softmax's denominator, attending to nothing."""
  q_spec, k_spec, v_spec = spec.split(",")
  logits = jnp.einsum(f"{q_spec},{k_spec}->bkgts", q, k).astype(jnp.float32) * scale
  logits = jnp.where(attn_mask_BxTxS[:, None, None, :, :], logits, jnp.finfo(jnp.float32).min)
  if sinks_KxQ is None:
    probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  else:
    sink = sinks_KxQ.astype(jnp.float32)[None, :, :, None, None]
    top = jnp.maximum(jnp.max(logits, axis=-1, keepdims=True), sink)
    e = jnp.exp(logits - top)
    probs = (e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))).astype(dt)
  return jnp.einsum(f"bkgts,{v_spec}->{q_spec}", probs, v)


def _library_attention(q_BxTxKxQxH, k_BxSxKxH, v_BxSxKxH, attn_mask_BxTxS, attention: str, scale: float):
  """`jax.nn.dot_product_attention` (XLA, or cuDNN flash attention for attention="cudnn"); [B, T, K, Q, H].
  Query head n uses key/value head n // Q in both this module and that function."""
  B, T, K, Q, H = q_BxTxKxQxH.shape
  out = jax.nn.dot_product_attention(q_BxTxKxQxH.reshape(B, T, K * Q, H), k_BxSxKxH, v_BxSxKxH,
                                     mask=attn_mask_BxTxS[:, None], scale=scale,
                                     implementation="cudnn" if attention == "cudnn" else "xla")
  return out.reshape(B, T, K, Q, H)


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
    if cfg.attention_output_gate:  # Qwen3.5: the other half of each head's q_proj rows
      self.gate_DxNxH = _param(rngs, init, (D, N, H), ("embed", "q_heads", "head_dim"), pd)
    if cfg.attention_bias:
      self.q_bias_NxH = nnx.Param(jnp.zeros((N, H), pd), out_sharding=("q_heads", "head_dim"), eager_sharding=False)
      self.k_bias_KxH = nnx.Param(jnp.zeros((K, H), pd), out_sharding=("kv_heads", "head_dim"), eager_sharding=False)
      self.v_bias_KxH = nnx.Param(jnp.zeros((K, H), pd), out_sharding=("kv_heads", "head_dim"), eager_sharding=False)
    if cfg.o_bias:
      self.o_bias_D = nnx.Param(jnp.zeros((D,), pd), out_sharding=("embed",), eager_sharding=False)
    if cfg.attention_sinks:
      self.sinks_N = nnx.Param(jnp.zeros((N,), pd), out_sharding=("q_heads",), eager_sharding=False)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(H, cfg.rms_norm_eps, pd, rngs=rngs, offset=cfg.norm_offset)
      self.k_norm = RMSNorm(H, cfg.rms_norm_eps, pd, rngs=rngs, offset=cfg.norm_offset)
    self.adapters = nnx.data(None)  # LoRA: a lora.LayerAdapters attached by lora.add_adapters

  def __call__(self, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache: LayerCache | None, cache_index,
               ring: bool = False):
    """`ring`: `cache` is a sliding-window layer's ring buffer and `attn_mask_BxTxS` the mask `_sliding_mask`
    made for it (over the ring's slots when T = 1, else over the ring's slots then the T new keys)."""
    cfg = self.cfg
    dt = cfg.jnp_dtype
    scale = cfg.attention_scale
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
    sinks = self.sinks_N[...].reshape(K, N // K) if cfg.attention_sinks else None
    new_cache = None
    if cache is None and cfg.attention != "einsum":
      out = _library_attention(q, k, v, attn_mask_BxTxS, cfg.attention, scale)
    elif cache is None:  # training: keys/values as projected, [B, S=T, K, H]
      out = _attend(q, k, v, attn_mask_BxTxS, "btkgh,bskh,bskh", dt, scale, sinks)
    elif ring and T > 1:
      out, new_cache = self._ring_block(q, k, v, attn_mask_BxTxS, cache, cache_index)
    else:
      if ring:  # one new key: written over the oldest, which is out of the window, then attended to in place
        cache_index = cache_index % cache.v_BxKxSxH.shape[2]
      # The T new keys/values are small; moving their axes (not the cache's) keeps the cache layout fixed
      # across decode steps. The query is put in [B, K, Q, T, H] too, so that both dots are batched over
      # (B, K) with every operand and result in place; with q as [B, T, K, Q, H] XLA on CPU swapped the dot
      # operands for T = 1 and decoding ran slower (benchmarks/README.md, "Figures behind code choices").
      cache_dt = cache.v_BxKxSxH.dtype
      k_new_BxKxHxT = jnp.transpose(k, (0, 2, 3, 1)).astype(cache_dt)
      k_all = jax.lax.dynamic_update_slice_in_dim(cache.k_BxKxHxS, k_new_BxKxHxT,
                                                  cache_index, axis=3)
      v_all = jax.lax.dynamic_update_slice_in_dim(cache.v_BxKxSxH, jnp.swapaxes(v, 1, 2).astype(cache_dt),
                                                  cache_index, axis=2)
      new_cache = LayerCache(k_all, v_all)
      if T > 1 and cfg.attention != "einsum":  # a prefill, or a training forward over a shared prompt's cache
        out = _library_attention(q, jnp.transpose(k_all, (0, 3, 1, 2)).astype(dt),
                                 jnp.swapaxes(v_all, 1, 2).astype(dt), attn_mask_BxTxS, cfg.attention, scale)
      elif T == 1 and cfg.decode_attention == "pallas":
        # A ring's slots are all filled once it wraps (the mask says which are); the others up to cache_index.
        filled = v_all.shape[2] if ring else cache_index + 1
        out = decode_attention(q[:, 0], k_all, v_all, attn_mask_BxTxS[:, 0], filled, scale)[:, None]
      else:
        out = _attend(jnp.moveaxis(q, 1, 3), k_all.astype(dt), v_all.astype(dt), attn_mask_BxTxS,
                      "bkgth,bkhs,bksh", dt, scale, sinks)
        out = jnp.moveaxis(out, 3, 1)
    # Flattening both (n, h) axes by hand keeps the contraction a plain [B*T, N*H] x [N*H, D] matmul; from the
    # einsum XLA chose (h, n) order and transposed the weight matrix at every decode step.
    out = out.reshape(B, T, N * H)
    if cfg.attention_output_gate:
      gate = jnp.einsum("btd,dnh->btnh", x_BxTxD, self.gate_DxNxH[...].astype(dt)).reshape(B, T, N * H)
      out = out * jax.nn.sigmoid(gate)
    y = out @ self.o_NxHxD[...].reshape(N * H, -1).astype(dt)
    if self.adapters is not None:
      y = self.adapters.add("o_proj", out, y)
    if cfg.o_bias:
      y = y + self.o_bias_D[...].astype(dt)
    return y, new_cache

  def _ring_block(self, q_BxTxKxQxH, k_BxTxKxH, v_BxTxKxH, attn_mask_BxTxW2, cache: LayerCache, cache_index):
    """T > 1 new tokens on a ring buffer of W slots: they attend to the ring's keys and to each other (a
    W + T key axis, the mask's), then the last min(T, W) of them are written at slots (index mod W)."""
    cfg = self.cfg
    dt = cfg.jnp_dtype
    T, W = q_BxTxKxQxH.shape[1], cache.v_BxKxSxH.shape[2]
    k_all_BxKxHxS = jnp.concatenate([cache.k_BxKxHxS.astype(dt), jnp.transpose(k_BxTxKxH, (0, 2, 3, 1))], axis=3)
    v_all_BxKxSxH = jnp.concatenate([cache.v_BxKxSxH.astype(dt), jnp.swapaxes(v_BxTxKxH, 1, 2)], axis=2)
    if cfg.attention != "einsum":
      out = _library_attention(q_BxTxKxQxH, jnp.transpose(k_all_BxKxHxS, (0, 3, 1, 2)),
                               jnp.swapaxes(v_all_BxKxSxH, 1, 2), attn_mask_BxTxW2, cfg.attention,
                               cfg.attention_scale)
    else:
      sinks = self.sinks_N[...].reshape(cfg.num_kv_heads, -1) if cfg.attention_sinks else None
      out = _attend(q_BxTxKxQxH, k_all_BxKxHxS, v_all_BxKxSxH, attn_mask_BxTxW2, "btkgh,bkhs,bksh", dt,
                    cfg.attention_scale, sinks)
    n = min(T, W)
    slots_n = (cache_index + T - n + jnp.arange(n)) % W
    cache_dt = cache.v_BxKxSxH.dtype
    k_new = jnp.transpose(k_BxTxKxH[:, T - n:], (0, 2, 3, 1)).astype(cache_dt)
    v_new = jnp.swapaxes(v_BxTxKxH[:, T - n:], 1, 2).astype(cache_dt)
    return out, LayerCache(cache.k_BxKxHxS.at[:, :, :, slots_n].set(k_new),
                           cache.v_BxKxSxH.at[:, :, slots_n, :].set(v_new))


def _sliding_mask(cfg: ModelConfig, attn_mask_BxTxS, cache: list[LayerCache] | None, cache_index):
  """The sliding-window layers' mask, from the global layers' `attn_mask_BxTxS`: key s is seen by query t
  when the global mask allows it and t - s < sliding_window (indices: slots of the global cache).

  Without a cache, [B, T, T]. With one (ring of W slots, `Attention._ring_block`): for T = 1, [B, 1, W] over
  the ring after the new key is written; for T > 1, [B, T, W + T] over the ring before writing, then the new
  keys. Ring slot r then holds the latest index i (< cache_index, or <= it for T = 1) with i mod W = r."""
  B, T, S = attn_mask_BxTxS.shape
  q_T = jnp.arange(T) + (0 if cache is None else cache_index)
  if cache is None:
    k_S = jnp.arange(S)
    return attn_mask_BxTxS & (q_T[:, None] - k_S[None, :] < cfg.sliding_window)[None]
  W = next(c.v_BxKxSxH.shape[2] for i, c in enumerate(cache) if cfg.is_sliding(i))
  last = cache_index if T == 1 else cache_index - 1  # latest index the ring holds
  ring_W = last - jnp.mod(last - jnp.arange(W), W)
  k_abs = ring_W if T == 1 else jnp.concatenate([ring_W, cache_index + jnp.arange(T)])
  allowed = jnp.take(attn_mask_BxTxS, jnp.clip(k_abs, 0, S - 1), axis=2)
  window = (k_abs[None, :] >= 0) & (q_T[:, None] - k_abs[None, :] < cfg.sliding_window)
  return allowed & window[None]


class MLP(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, F, pd = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_param_dtype
    init = _normal(0.02)
    # Gemma's GeGLU uses transformers' gelu_pytorch_tanh: the tanh approximation.
    self.act = (lambda x: jax.nn.gelu(x, approximate=True)) if cfg.gemma else jax.nn.silu
    self.gate_DxF = _param(rngs, init, (D, F), ("embed", "mlp"), pd)
    self.up_DxF = _param(rngs, init, (D, F), ("embed", "mlp"), pd)
    self.down_FxD = _param(rngs, init, (F, D), ("mlp", "embed"), pd)
    self.adapters = nnx.data(None)  # LoRA: a lora.LayerAdapters attached by lora.add_adapters

  def __call__(self, x_BxTxD):
    dt = self.cfg.jnp_dtype
    gate = x_BxTxD @ self.gate_DxF[...].astype(dt)
    up = x_BxTxD @ self.up_DxF[...].astype(dt)
    if self.adapters is None:
      return (self.act(gate) * up) @ self.down_FxD[...].astype(dt)
    gate = self.adapters.add("gate_proj", x_BxTxD, gate)
    up = self.adapters.add("up_proj", x_BxTxD, up)
    hidden = self.act(gate) * up
    return self.adapters.add("down_proj", hidden, hidden @ self.down_FxD[...].astype(dt))


class DecoderLayer(nnx.Module):
  """Llama / Qwen: x + attn(norm(x)), then + mlp(post_attn_norm(x)). Gemma 3: four norms, x + post_attn_norm(
  attn(norm(x))), then + post_mlp_norm(mlp(pre_mlp_norm(x))) (transformers' post_attention_layernorm is the
  pre-MLP norm of Llama but the attention output's norm of Gemma)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, sliding: bool = False, moe: bool = False,
               linear: bool = False):
    pd = cfg.jnp_param_dtype
    norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs, offset=cfg.norm_offset)
    self.gemma, self.sliding, self.linear = cfg.gemma, sliding, linear
    self.input_norm = norm()
    self.attn = GatedDeltaNet(cfg, rngs=rngs) if linear else Attention(cfg, rngs=rngs)
    self.post_attn_norm = norm()
    if cfg.gemma:
      self.pre_mlp_norm = norm()
      self.post_mlp_norm = norm()
    self.mlp = MoE(cfg, rngs=rngs) if moe else MLP(cfg, rngs=rngs)

  def __call__(self, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache, cache_index, experts_BxTxk=None):
    """-> (x, new_cache, routing): routing is the expert block's (router logits [B, T, E] float32, experts
    [B, T, k]), None for a dense MLP; `experts_BxTxk` replays given experts (moe.MoE). A linear-attention layer
    takes which tokens are real [B, T] as its mask and no rotary tables."""
    if self.linear:
      h, new_cache = self.attn(self.input_norm(x_BxTxD), attn_mask_BxTxS, cache)
    else:
      h, new_cache = self.attn(self.input_norm(x_BxTxD), rope_cos_sin, attn_mask_BxTxS, cache, cache_index,
                               ring=self.sliding)
    if self.gemma:
      x_BxTxD = x_BxTxD + self.post_attn_norm(h)
      return x_BxTxD + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x_BxTxD))), new_cache, None
    x_BxTxD = x_BxTxD + h
    if isinstance(self.mlp, MoE):
      y, routing = self.mlp(self.post_attn_norm(x_BxTxD), experts_BxTxk, with_routing=True)
      return x_BxTxD + y, new_cache, routing
    return x_BxTxD + self.mlp(self.post_attn_norm(x_BxTxD)), new_cache, None


def _rematerialized(layer: DecoderLayer, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache: LayerCache | None,
                    cache_index, experts_BxTxk=None):
  """`layer(x, ...)` -> (x, new_cache, routing), its activations recomputed in the backward pass instead of stored.

  `jax.checkpoint` of a pure function of the layer's split state: `nnx.remat` on the module itself raised
  "Cannot mutate Param from a different trace level" under `jax.value_and_grad` of merged parameters (the
  update's pattern). Only the layer's inputs (and its cache, when given) are saved for the backward pass
  (tests/model/test_remat.py). XLA:CPU merges the recomputation back into the forward pass, so on a CPU remat
  saves no memory; GPUs and TPUs keep it.
  """
  graphdef, state = nnx.split(layer)

  def forward(state, x, cos_sin, mask, cache, experts):
    return nnx.merge(graphdef, state)(x, cos_sin, mask, cache, cache_index, experts)

  return jax.checkpoint(forward)(state, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache, experts_BxTxk)


class Transformer(nnx.Module):
  """`__call__` returns final-norm hidden states [B,T,D]; `logits(hidden)` projects to the vocabulary."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.jnp_param_dtype
    self.embed_VxD = _param(rngs, _normal(0.02), (cfg.vocab_size, cfg.hidden_size),
                            ("vocab", "embed"), pd)
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs, sliding=cfg.is_sliding(i), moe=cfg.is_moe(i),
                                         linear=cfg.is_linear(i)) for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs, offset=cfg.norm_offset)
    if not cfg.tie_word_embeddings:
      self.lm_head_DxV = _param(rngs, _normal(0.02), (cfg.hidden_size, cfg.vocab_size),
                                ("embed", "vocab"), pd)

  def __call__(self, tokens_BxT, positions_BxT, attn_mask_BxTxS, cache: list[LayerCache] | None = None,
               cache_index=0, rope_cos_sin=None, remat: bool | None = None, experts=None, with_routing=False):
    """Returns (hidden_BxTxD, new_cache or None). With a cache, keys/values are written at `cache_index`.

    Mixtures of experts: `experts`, one [B, T, k] int array per expert layer in order (`cfg.is_moe`), makes each
    use those experts (routing replay, moe.MoE); `with_routing` returns a third item, one (router logits
    [B, T, E] float32, chosen experts [B, T, k]) per expert layer.

    `remat`: rematerialize each layer in the backward pass; None means `cfg.remat` without a cache (the
    sampler's cached decoding takes no gradients) and a training forward through a cache passes it explicitly.

    `rope_cos_sin`: `self.rope_tables(positions_BxT)` computed by the caller, who may then pass None as the
    positions. A decode loop computes every step's tables once before the loop: inside it, XLA fused the
    cos/sin evaluation into each layer's kernels (8 copies per step for 4 layers).
    """
    cfg = self.cfg
    x = jnp.take(self.embed_VxD[...], tokens_BxT, axis=0).astype(cfg.jnp_dtype)
    if cfg.gemma:  # sqrt(hidden_size) rounded to the compute dtype, as transformers rounds it to the weights'
      x = x * jnp.asarray(math.sqrt(cfg.hidden_size), cfg.jnp_dtype)
    if rope_cos_sin is None:
      rope_cos_sin = self.rope_tables(positions_BxT)
    if remat is None:
      remat = cfg.remat and cache is None
    masks = {FULL: attn_mask_BxTxS}
    if cfg.has_sliding:
      masks[SLIDING] = _sliding_mask(cfg, attn_mask_BxTxS, cache, cache_index)
    if cfg.has_linear:  # a token is real when it may attend to itself (its key sits at slot cache_index + t)
      B, T = tokens_BxT.shape
      own_slot = jnp.broadcast_to((cache_index + jnp.arange(T))[None, :, None], (B, T, 1))
      masks[LINEAR] = jnp.take_along_axis(attn_mask_BxTxS, own_slot, axis=2)[..., 0]
    new_cache = [] if cache is not None else None
    replay = iter(experts or ())
    routing = []
    for i, layer in enumerate(self.layers):
      layer_cache = cache[i] if cache is not None else None
      kind = cfg.layer_types[i] if cfg.layer_types else FULL
      args = (x, rope_cos_sin.get(kind), masks[kind], layer_cache, cache_index,
              next(replay) if experts is not None and cfg.is_moe(i) else None)
      x, c, r = _rematerialized(layer, *args) if remat else layer(*args)
      if cache is not None:
        new_cache.append(c)
      if r is not None:
        routing.append(r)
    if with_routing:
      return self.final_norm(x), new_cache, tuple(routing)
    return self.final_norm(x), new_cache

  def rope_tables(self, positions_BxT) -> dict[str, tuple[jax.Array, jax.Array]]:
    """Layer type (config.FULL, and config.SLIDING when the model has such layers) -> (cos, sin), each
    [B, T, 1, H/2] float32: the rotary tables for these positions."""
    tables = {FULL: rope_tables(positions_BxT, rope_inv_freq(self.cfg))}
    if (factor := rope_attention_factor(self.cfg)) != 1.0:
      tables[FULL] = tuple(t * factor for t in tables[FULL])
    if self.cfg.has_sliding:
      tables[SLIDING] = (rope_tables(positions_BxT, rope_inv_freq(self.cfg, sliding=True)) if self.cfg.gemma
                         else tables[FULL])
    return tables

  def output_matrix_DxV(self) -> jax.Array:
    if self.cfg.tie_word_embeddings:
      return self.embed_VxD[...].T
    return self.lm_head_DxV[...]

  def logits(self, hidden_BxTxD) -> jax.Array:
    """float32 logits [B,T,V]. For log-probs over a large vocabulary use `logprobs.token_logprobs`."""
    return jnp.einsum("btd,dv->btv", hidden_BxTxD, self.output_matrix_DxV().astype(hidden_BxTxD.dtype),
                      preferred_element_type=jnp.float32)
