"""Decoder-only transformer (Llama / Qwen2 / Qwen3 / Gemma 3 / Gemma 4, Qwen3-MoE / gpt-oss, Qwen3.5 families) in
Flax NNX.

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

Gemma 4 (`cfg.gemma4`): checked against transformers' Gemma4ForCausalLM (tests/model/test_gemma4.py). Its
full-attention layers may have their own head_dim and kv-head count (each layer's cache has its layer's), and its
last `num_kv_shared_layers` layers attend to the keys and values of the last earlier layer of their type, exactly
the ones that layer attended to (`Attention.__call__`'s `shared_kv`): they hold no cache (None in `init_cache`'s
list) and project no keys or values.

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

from grpo_jax.model.config import (FULL, LINEAR, SLIDING, LinearRopeScaling, ModelConfig, ProportionalRope,
                                   YarnRopeScaling)
from grpo_jax.model.decode_attention import decode_attention
from grpo_jax.model.initializers import normal as _normal, param as _param
from grpo_jax.model.linear_attention import GatedDeltaNet, LinearCache, init_linear_cache
from grpo_jax.model.moe import MoE, rms_normalize


class LayerCache(NamedTuple):
  k_BxKxHxS: jax.Array
  v_BxKxSxH: jax.Array


def cache_slots(cfg: ModelConfig, layer: int, length: int) -> int:
  """Slots of layer `layer`'s cache for a cache of `length` positions: `length`, or for a sliding-window layer
  min(sliding_window, length) (a ring buffer)."""
  return min(cfg.sliding_window, length) if cfg.is_sliding(layer) else length


def init_cache(cfg: ModelConfig, batch: int, length: int) -> list[LayerCache | LinearCache | None]:
  """One zero `LayerCache` per attention layer in the model dtype: keys [batch, num_kv_heads, head_dim, slots],
  values [batch, num_kv_heads, slots, head_dim] (the layer's own kv heads and head_dim), slots =
  `cache_slots(cfg, layer, length)`; a `LinearCache` per linear-attention layer (its size independent of
  `length`); None for a layer that reads another layer's keys and values (`cfg.kv_source`)."""
  def kv(i):
    B, K, H, S = batch, cfg.layer_kv_heads(i), cfg.layer_head_dim(i), cache_slots(cfg, i, length)
    return LayerCache(jnp.zeros((B, K, H, S), cfg.jnp_dtype), jnp.zeros((B, K, S, H), cfg.jnp_dtype))
  return [init_linear_cache(cfg, batch) if cfg.is_linear(i) else None if cfg.kv_source(i) is not None else kv(i)
          for i in range(cfg.num_layers)]


def extend_cache(cfg: ModelConfig, cache: list[LayerCache], extra: int) -> list[LayerCache]:
  """A cache of `length` positions (all written) grown to `length + extra`: global layers get `extra` empty
  slots; a ring that holds fewer than sliding_window slots never wrapped (slot = index), so it grows the same
  way, up to sliding_window slots."""
  out = []
  for i, c in enumerate(cache):
    if c is None or isinstance(c, LinearCache):  # no cache (shared keys and values), or a fixed-size one
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
  """[R/2] inverse frequencies (R = the rotated dimensions of that layer type's heads: cfg.rotary_dim for global
  layers) of global layers (rope_theta, with rope_scaling when configured) or of Gemma's sliding layers
  (local_rope_theta, unscaled); gpt-oss's sliding layers use the global ones."""
  theta = cfg.local_rope_theta if sliding else cfg.rope_theta
  dim = int(cfg.head_dim_of(SLIDING if sliding else FULL) * cfg.partial_rotary_factor)
  inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  rs = None if sliding else cfg.rope_scaling
  if rs is None:
    return inv
  if isinstance(rs, LinearRopeScaling):
    return inv / rs.factor
  if isinstance(rs, ProportionalRope):  # zero frequencies: cos 1, sin 0, those dimensions pass exactly unrotated
    return jnp.where(jnp.arange(dim // 2) < int(rs.partial_rotary_factor * dim // 2), inv, 0.0) / rs.factor
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


def softcap(logits, cap: float | None):
  """cap * tanh(logits / cap) (Gemma 4's final_logit_softcapping), or the logits unchanged for None."""
  return logits if cap is None else cap * jnp.tanh(logits / cap)


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
  """Grouped-query attention of layer `layer` (its head_dim and kv heads: `cfg.layer_head_dim`,
  `cfg.layer_kv_heads`). A Gemma 4 layer that reads another's keys and values (`cfg.kv_source`) has no key or value
  projection; one whose values are its raw keys (`cfg.values_from_keys`) has no value projection."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, layer: int = 0):
    self.cfg = cfg
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.layer_kv_heads(layer), cfg.layer_head_dim(layer)
    self.num_kv_heads = K
    self.scale = (cfg.query_pre_attn_scalar or H) ** -0.5
    self.shares_kv = cfg.kv_source(layer) is not None
    self.values_from_keys = cfg.values_from_keys(layer)
    pd = cfg.jnp_param_dtype
    init = _normal(0.02)
    self.q_DxNxH = _param(rngs, init, (D, N, H), ("embed", "q_heads", "head_dim"), pd)
    if not self.shares_kv:
      self.k_DxKxH = _param(rngs, init, (D, K, H), ("embed", "kv_heads", "head_dim"), pd)
      if not self.values_from_keys:
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
      if not self.shares_kv:
        self.k_norm = RMSNorm(H, cfg.rms_norm_eps, pd, rngs=rngs, offset=cfg.norm_offset)
    self.adapters = nnx.data(None)  # LoRA: a lora.LayerAdapters attached by lora.add_adapters

  def __call__(self, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache: LayerCache | None, cache_index,
               ring: bool = False, shared_kv=None, cached: bool = False):
    """-> (y, new_cache, (keys, values) attended). `ring`: `cache` is a sliding-window layer's ring buffer and
    `attn_mask_BxTxS` the mask `_sliding_mask` made for it (over the ring's slots when T = 1, else over the ring's
    slots then the T new keys).

    `shared_kv` (a layer with `cfg.kv_source`): the (keys, values) that layer returned, which this one attends to
    with its own queries and the same mask; `cached` says whether they are a cache's (keys [B, K, H, S], values
    [B, K, S, H]; for a ring and T > 1 its slots then the T new ones) or a training forward's ([B, T, K, H])."""
    cfg = self.cfg
    dt = cfg.jnp_dtype
    q = jnp.einsum("btd,dnh->btnh", x_BxTxD, self.q_DxNxH[...].astype(dt))
    k = v = None
    if not self.shares_kv:
      k = jnp.einsum("btd,dkh->btkh", x_BxTxD, self.k_DxKxH[...].astype(dt))
      if not self.values_from_keys:
        v = jnp.einsum("btd,dkh->btkh", x_BxTxD, self.v_DxKxH[...].astype(dt))
    if self.adapters is not None:
      q = self.adapters.add("q_proj", x_BxTxD, q)
      if k is not None:
        k = self.adapters.add("k_proj", x_BxTxD, k)
      if v is not None:
        v = self.adapters.add("v_proj", x_BxTxD, v)
    if self.values_from_keys:  # Gemma 4's attention_k_eq_v: the raw keys, before their norm and RoPE
      v = k
    if cfg.attention_bias:
      q = q + self.q_bias_NxH[...].astype(dt)
      k = k + self.k_bias_KxH[...].astype(dt)
      v = v + self.v_bias_KxH[...].astype(dt)
    if cfg.qk_norm:
      q = self.q_norm(q)
      k = None if k is None else self.k_norm(k)
    if cfg.gemma4 and v is not None:
      v = rms_normalize(v, cfg.rms_norm_eps)
    q = apply_rope(q, rope_cos_sin)
    k = None if k is None else apply_rope(k, rope_cos_sin)

    B, T, N, H = q.shape
    K = self.num_kv_heads
    q = q.reshape(B, T, K, N // K, H)
    new_cache = None
    if shared_kv is not None:
      out, kv = self._attend_to(q, *shared_kv, attn_mask_BxTxS, cached, ring, cache_index), None
    elif cache is None:  # training: keys/values as projected, [B, S=T, K, H]
      out, kv = self._attend_to(q, k, v, attn_mask_BxTxS, False, ring, cache_index), (k, v)
    elif ring and T > 1:
      out, new_cache, kv = self._ring_block(q, k, v, attn_mask_BxTxS, cache, cache_index)
    else:
      if ring:  # one new key: written over the oldest, which is out of the window, then attended to in place
        cache_index = cache_index % cache.v_BxKxSxH.shape[2]
      # The T new keys/values are small; moving their axes (not the cache's) keeps the cache layout fixed
      # across decode steps.
      cache_dt = cache.v_BxKxSxH.dtype
      k_new_BxKxHxT = jnp.transpose(k, (0, 2, 3, 1)).astype(cache_dt)
      # A [B] cache_index (continuous batching: each row at its own slot) writes each row where it says.
      write = (jax.lax.dynamic_update_slice_in_dim if jnp.ndim(cache_index) == 0 else
               jax.vmap(jax.lax.dynamic_update_slice_in_dim, in_axes=(0, 0, 0, None)))
      k_all = write(cache.k_BxKxHxS, k_new_BxKxHxT, cache_index, 3 - jnp.ndim(cache_index))
      v_all = write(cache.v_BxKxSxH, jnp.swapaxes(v, 1, 2).astype(cache_dt), cache_index, 2 - jnp.ndim(cache_index))
      new_cache = kv = LayerCache(k_all, v_all)
      out = self._attend_to(q, k_all, v_all, attn_mask_BxTxS, True, ring, cache_index)
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
    return y, new_cache, kv

  def _attend_to(self, q_BxTxKxQxH, k, v, attn_mask_BxTxS, cached: bool, ring: bool, cache_index):
    """[B, T, K, Q, H]: q attends to keys/values `k`, `v` as `__call__`'s `shared_kv` lays them out (`cached`);
    a ring's cache_index already taken mod its slots for T = 1."""
    cfg = self.cfg
    dt, scale = cfg.jnp_dtype, self.scale
    T = q_BxTxKxQxH.shape[1]
    sinks = self.sinks_N[...].reshape(self.num_kv_heads, -1) if cfg.attention_sinks else None
    if not cached:
      if cfg.attention != "einsum":
        return _library_attention(q_BxTxKxQxH, k, v, attn_mask_BxTxS, cfg.attention, scale)
      return _attend(q_BxTxKxQxH, k, v, attn_mask_BxTxS, "btkgh,bskh,bskh", dt, scale, sinks)
    if ring and T > 1:  # the ring's W slots then the T new keys, already in the compute dtype
      if cfg.attention != "einsum":
        return _library_attention(q_BxTxKxQxH, jnp.transpose(k, (0, 3, 1, 2)), jnp.swapaxes(v, 1, 2), attn_mask_BxTxS,
                                  cfg.attention, scale)
      return _attend(q_BxTxKxQxH, k, v, attn_mask_BxTxS, "btkgh,bkhs,bksh", dt, scale, sinks)
    if T > 1 and cfg.attention != "einsum":  # a prefill, or a training forward over a shared prompt's cache
      return _library_attention(q_BxTxKxQxH, jnp.transpose(k, (0, 3, 1, 2)).astype(dt),
                                jnp.swapaxes(v, 1, 2).astype(dt), attn_mask_BxTxS, cfg.attention, scale)
    if T == 1 and cfg.decode_attention == "pallas":
      # A ring's slots are all filled once it wraps (the mask says which are); the others up to cache_index.
      # A [B] index (rows at their own slots): up to the furthest row; the mask hides the rest from the others.
      filled = v.shape[2] if ring else (cache_index if jnp.ndim(cache_index) == 0 else jnp.max(cache_index)) + 1
      return decode_attention(q_BxTxKxQxH[:, 0], k, v, attn_mask_BxTxS[:, 0], filled, scale)[:, None]
    # The query is put in [B, K, Q, T, H] too, so that both dots are batched over (B, K) with every operand and
    # result in place; with q as [B, T, K, Q, H] XLA on CPU swapped the dot operands for T = 1 and decoding ran
    # slower (benchmarks/README.md, "Figures behind code choices").
    out = _attend(jnp.moveaxis(q_BxTxKxQxH, 1, 3), k.astype(dt), v.astype(dt), attn_mask_BxTxS,
                  "bkgth,bkhs,bksh", dt, scale, sinks)
    return jnp.moveaxis(out, 3, 1)

  def _ring_block(self, q_BxTxKxQxH, k_BxTxKxH, v_BxTxKxH, attn_mask_BxTxW2, cache: LayerCache, cache_index):
    """T > 1 new tokens on a ring buffer of W slots: they attend to the ring's keys and to each other (a
    W + T key axis, the mask's), then the last min(T, W) of them are written at slots (index mod W). Returns
    (out, new ring, the W + T keys and values attended)."""
    dt = self.cfg.jnp_dtype
    T, W = q_BxTxKxQxH.shape[1], cache.v_BxKxSxH.shape[2]
    k_all_BxKxHxS = jnp.concatenate([cache.k_BxKxHxS.astype(dt), jnp.transpose(k_BxTxKxH, (0, 2, 3, 1))], axis=3)
    v_all_BxKxSxH = jnp.concatenate([cache.v_BxKxSxH.astype(dt), jnp.swapaxes(v_BxTxKxH, 1, 2)], axis=2)
    out = self._attend_to(q_BxTxKxQxH, k_all_BxKxHxS, v_all_BxKxSxH, attn_mask_BxTxW2, True, True, cache_index)
    n = min(T, W)
    slots_n = (cache_index + T - n + jnp.arange(n)) % W
    cache_dt = cache.v_BxKxSxH.dtype
    k_new = jnp.transpose(k_BxTxKxH[:, T - n:], (0, 2, 3, 1)).astype(cache_dt)
    v_new = jnp.swapaxes(v_BxTxKxH[:, T - n:], 1, 2).astype(cache_dt)
    return out, LayerCache(cache.k_BxKxHxS.at[:, :, :, slots_n].set(k_new),
                           cache.v_BxKxSxH.at[:, :, slots_n, :].set(v_new)), (k_all_BxKxHxS, v_all_BxKxSxH)


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
  W = next(c.v_BxKxSxH.shape[2] for i, c in enumerate(cache) if cfg.is_sliding(i) and c is not None)
  if jnp.ndim(cache_index) == 1:  # one index per row (T = 1): each row's mask as a scalar index would make it
    return jax.vmap(lambda m, i: _sliding_mask(cfg, m[None], cache, i)[0])(attn_mask_BxTxS, cache_index)
  last = cache_index if T == 1 else cache_index - 1  # latest index the ring holds
  ring_W = last - jnp.mod(last - jnp.arange(W), W)
  k_abs = ring_W if T == 1 else jnp.concatenate([ring_W, cache_index + jnp.arange(T)])
  allowed = jnp.take(attn_mask_BxTxS, jnp.clip(k_abs, 0, S - 1), axis=2)
  window = (k_abs[None, :] >= 0) & (q_T[:, None] - k_abs[None, :] < cfg.sliding_window)
  return allowed & window[None]


class MLP(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, intermediate_size: int | None = None):
    self.cfg = cfg
    D, F, pd = cfg.hidden_size, intermediate_size or cfg.intermediate_size, cfg.jnp_param_dtype
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
  pre-MLP norm of Llama but the attention output's norm of Gemma). Gemma 4's expert block (`moe`) runs beside its
  MLP: x + post_mlp_norm(post_mlp_norm_1(mlp(pre_mlp_norm(x))) + post_experts_norm(experts(pre_experts_norm(x))))
  with the router reading x itself. Then its per-layer input (`per_layer_input_size` > 0), x + ple_norm(
  gelu(x W_gate) * input_BxTxP) W_proj, and the whole residual stream times `layer_scalar`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, sliding: bool = False, moe: bool = False,
               linear: bool = False, layer: int = 0):
    pd = cfg.jnp_param_dtype
    norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs, offset=cfg.norm_offset)
    self.gemma, self.gemma4, self.sliding, self.linear = cfg.gemma, cfg.gemma4, sliding, linear
    self.input_norm = norm()
    self.attn = GatedDeltaNet(cfg, rngs=rngs) if linear else Attention(cfg, rngs=rngs, layer=layer)
    self.post_attn_norm = norm()
    if cfg.gemma:
      self.pre_mlp_norm = norm()
      self.post_mlp_norm = norm()
    if moe and not cfg.gemma4:
      self.mlp = MoE(cfg, rngs=rngs)
    else:
      self.mlp = MLP(cfg, rngs=rngs, intermediate_size=cfg.layer_intermediate_size(layer))
    if moe and cfg.gemma4:  # the expert block beside the MLP, each with its output norm
      self.experts = MoE(cfg, rngs=rngs)
      self.post_mlp_norm_1 = norm()
      self.pre_experts_norm = norm()
      self.post_experts_norm = norm()
    if cfg.per_layer_input_size:
      D, P = cfg.hidden_size, cfg.per_layer_input_size
      self.ple_gate_DxP = _param(rngs, _normal(0.02), (D, P), ("embed", None), pd)
      self.ple_proj_PxD = _param(rngs, _normal(0.02), (P, D), (None, "embed"), pd)
      self.ple_norm = norm()
    if cfg.gemma4:  # a persistent buffer in transformers, loaded from the checkpoint; a parameter here
      self.layer_scalar = nnx.Param(jnp.ones((1,), pd), out_sharding=(None,), eager_sharding=False)

  def __call__(self, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache, cache_index, experts_BxTxk=None,
               per_layer_input_BxTxP=None, shared_kv=None, cached: bool = False):
    """-> (x, new_cache, routing, (keys, values) attended or None): routing is the expert block's (router logits
    [B, T, E] float32, experts [B, T, k]), None for a dense MLP; `experts_BxTxk` replays given experts (moe.MoE).
    A linear-attention layer takes which tokens are real [B, T] as its mask and no rotary tables.
    `per_layer_input_BxTxP`: Gemma 4's per-layer input of this layer; `shared_kv`, `cached`: Attention's."""
    kv = None
    if self.linear:
      h, new_cache = self.attn(self.input_norm(x_BxTxD), attn_mask_BxTxS, cache)
    else:
      h, new_cache, kv = self.attn(self.input_norm(x_BxTxD), rope_cos_sin, attn_mask_BxTxS, cache, cache_index,
                                   ring=self.sliding, shared_kv=shared_kv, cached=cached)
    routing = None
    if self.gemma:
      x_BxTxD = x_BxTxD + self.post_attn_norm(h)
      y = self.mlp(self.pre_mlp_norm(x_BxTxD))
      if hasattr(self, "experts"):
        e, routing = self.experts(self.pre_experts_norm(x_BxTxD), experts_BxTxk, with_routing=True,
                                  router_input_BxTxD=x_BxTxD)
        y = self.post_mlp_norm_1(y) + self.post_experts_norm(e)
      x_BxTxD = x_BxTxD + self.post_mlp_norm(y)
      if per_layer_input_BxTxP is not None:
        dt = x_BxTxD.dtype
        gate = jax.nn.gelu(x_BxTxD @ self.ple_gate_DxP[...].astype(dt), approximate=True) * per_layer_input_BxTxP
        x_BxTxD = x_BxTxD + self.ple_norm(gate @ self.ple_proj_PxD[...].astype(dt))
      if self.gemma4:
        x_BxTxD = x_BxTxD * self.layer_scalar[...].astype(x_BxTxD.dtype)
      return x_BxTxD, new_cache, routing, kv
    x_BxTxD = x_BxTxD + h
    if isinstance(self.mlp, MoE):
      y, routing = self.mlp(self.post_attn_norm(x_BxTxD), experts_BxTxk, with_routing=True)
      return x_BxTxD + y, new_cache, routing, kv
    return x_BxTxD + self.mlp(self.post_attn_norm(x_BxTxD)), new_cache, None, kv


def _rematerialized(layer: DecoderLayer, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache: LayerCache | None,
                    cache_index, experts_BxTxk=None, per_layer_input_BxTxP=None, shared_kv=None, cached: bool = False):
  """`layer(x, ...)` -> (x, new_cache, routing, kv), its activations recomputed in the backward pass instead of
  stored.

  `jax.checkpoint` of a pure function of the layer's split state: `nnx.remat` on the module itself raised
  "Cannot mutate Param from a different trace level" under `jax.value_and_grad` of merged parameters (the
  update's pattern). Only the layer's inputs (and its cache, when given) are saved for the backward pass
  (tests/model/test_remat.py). XLA:CPU merges the recomputation back into the forward pass, so on a CPU remat
  saves no memory; GPUs and TPUs keep it.
  """
  graphdef, state = nnx.split(layer)

  def forward(state, x, cos_sin, mask, cache, experts, per_layer_input, shared_kv):
    return nnx.merge(graphdef, state)(x, cos_sin, mask, cache, cache_index, experts, per_layer_input, shared_kv,
                                      cached)

  return jax.checkpoint(forward)(state, x_BxTxD, rope_cos_sin, attn_mask_BxTxS, cache, experts_BxTxk,
                                 per_layer_input_BxTxP, shared_kv)


class Transformer(nnx.Module):
  """`__call__` returns final-norm hidden states [B,T,D]; `logits(hidden)` projects to the vocabulary."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.jnp_param_dtype
    self.embed_VxD = _param(rngs, _normal(0.02), (cfg.vocab_size, cfg.hidden_size),
                            ("vocab", "embed"), pd)
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs, sliding=cfg.is_sliding(i), moe=cfg.is_moe(i),
                                         linear=cfg.is_linear(i), layer=i) for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs, offset=cfg.norm_offset)
    if not cfg.tie_word_embeddings:
      self.lm_head_DxV = _param(rngs, _normal(0.02), (cfg.hidden_size, cfg.vocab_size),
                                ("embed", "vocab"), pd)
    if cfg.per_layer_input_size:  # Gemma 4's per-layer inputs: a token table and a projection of the embedding
      LP = cfg.num_layers * cfg.per_layer_input_size
      self.ple_embed_VxLP = _param(rngs, _normal(0.02), (cfg.per_layer_input_vocab_size, LP), ("vocab", None), pd)
      self.ple_model_proj_DxLP = _param(rngs, _normal(0.02), (cfg.hidden_size, LP), ("embed", None), pd)
      self.ple_proj_norm = RMSNorm(cfg.per_layer_input_size, cfg.rms_norm_eps, pd, rngs=rngs)

  def __call__(self, tokens_BxT, positions_BxT, attn_mask_BxTxS, cache: list[LayerCache] | None = None,
               cache_index=0, rope_cos_sin=None, remat: bool | None = None, experts=None, with_routing=False):
    """Returns (hidden_BxTxD, new_cache or None). With a cache, keys/values are written at `cache_index`: a
    scalar, or for one token (T = 1) a [B] array, each row's own slot (the sampler's continuous batching).

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
    per_layer_inputs = self._per_layer_inputs(tokens_BxT, x) if cfg.per_layer_input_size else None
    masks = {FULL: attn_mask_BxTxS}
    if cfg.has_sliding:
      masks[SLIDING] = _sliding_mask(cfg, attn_mask_BxTxS, cache, cache_index)
    if cfg.has_linear:  # a token is real when it may attend to itself (its key sits at slot cache_index + t)
      B, T = tokens_BxT.shape
      if jnp.ndim(cache_index) == 0:
        own_slot = jnp.broadcast_to((cache_index + jnp.arange(T))[None, :, None], (B, T, 1))
      else:  # one index per row
        own_slot = (cache_index[:, None] + jnp.arange(T))[..., None]
      masks[LINEAR] = jnp.take_along_axis(attn_mask_BxTxS, own_slot, axis=2)[..., 0]
    new_cache = [] if cache is not None else None
    replay = iter(experts or ())
    routing = []
    attended = {}  # layer type -> the keys and values its latest layer attended to (Gemma 4's shared ones)
    for i, layer in enumerate(self.layers):
      layer_cache = cache[i] if cache is not None else None
      kind = cfg.layer_types[i] if cfg.layer_types else FULL
      args = (x, rope_cos_sin.get(kind), masks[kind], layer_cache, cache_index,
              next(replay) if experts is not None and cfg.is_moe(i) else None,
              None if per_layer_inputs is None else per_layer_inputs[:, :, i],
              attended[kind] if cfg.kv_source(i) is not None else None)
      x, c, r, kv = (_rematerialized(layer, *args, cached=cache is not None) if remat
                     else layer(*args, cached=cache is not None))
      if kv is not None and cfg.num_kv_shared_layers:
        attended[kind] = kv
      if cache is not None:
        new_cache.append(c)
      if r is not None:
        routing.append(r)
    if with_routing:
      return self.final_norm(x), new_cache, tuple(routing)
    return self.final_norm(x), new_cache

  def _per_layer_inputs(self, tokens_BxT, x_BxTxD):
    """[B, T, L, P]: Gemma 4's per-layer inputs, (norm(x W / sqrt(D)) + table[token] sqrt(P)) / sqrt(2), from the
    tokens and their scaled embeddings x (transformers' get_per_layer_inputs and project_per_layer_inputs)."""
    cfg = self.cfg
    dt = cfg.jnp_dtype
    B, T = tokens_BxT.shape
    L, P = cfg.num_layers, cfg.per_layer_input_size
    table = jnp.take(self.ple_embed_VxLP[...], tokens_BxT, axis=0).astype(dt) * jnp.asarray(math.sqrt(P), dt)
    projected = (x_BxTxD @ self.ple_model_proj_DxLP[...].astype(dt)) * cfg.hidden_size ** -0.5
    projected = self.ple_proj_norm(projected.reshape(B, T, L, P))
    return (projected + table.reshape(B, T, L, P)) * 2 ** -0.5

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
    """float32 logits [B,T,V] (soft-capped with cfg.final_logit_softcapping). For log-probs over a large vocabulary
    use `logprobs.token_logprobs`."""
    logits = jnp.einsum("btd,dv->btv", hidden_BxTxD, self.output_matrix_DxV().astype(hidden_BxTxD.dtype),
                        preferred_element_type=jnp.float32)
    return softcap(logits, self.cfg.final_logit_softcapping)
