"""Qwen3.5's linear-attention layer (Gated DeltaNet) and the recurrent cache it decodes with.

Per token: x -> in_proj_qkv -> a causal depthwise convolution of K taps over the last K tokens -> SiLU -> q, k, v
heads; the gated delta rule (grpo_jax/model/gated_delta.py) with write strength beta = sigmoid(x W_b) and log-decay
g = -exp(A_log) softplus(x W_a + dt_bias); its output RMS-normalized per value head, times SiLU(x W_z), projected
back to D. Shapes: B batch, T tokens, D hidden, C = 2 Hk Dk + Hv Dv convolution channels (q, k, v in that order),
K taps, Hk query/key heads of Dk, Hv value heads of Dv.

Instead of a KV cache growing with the sequence, a row decodes with a fixed-size `LinearCache`: the convolution's
last K - 1 inputs and the delta rule's state [Hv, Dk, Dv]. A prefill (T > 1) runs the chunked form from the cached
state and a decode step (T = 1) the recurrent one, so a row's cost per token does not grow with its length.

Padding: tokens that are not real (`valid_BxT` False: the left padding of a prompt) enter the convolution as zeros,
as transformers zeroes them, and leave the state untouched (g = beta = 0), so a left-padded row computes exactly
what its unpadded tokens would.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax.model import gated_delta
from grpo_jax.model.config import ModelConfig
from grpo_jax.model.initializers import normal as _normal, param as _param


class LinearCache(NamedTuple):
  conv_BxKm1xC: jax.Array       # the convolution's last K - 1 inputs, model dtype
  state_BxHvxDkxDv: jax.Array   # the delta rule's state, float32


def channels(cfg: ModelConfig) -> int:
  return 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim


def init_linear_cache(cfg: ModelConfig, batch: int) -> LinearCache:
  return LinearCache(jnp.zeros((batch, cfg.linear_conv_kernel - 1, channels(cfg)), cfg.jnp_dtype),
                     jnp.zeros((batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                cfg.linear_value_head_dim), jnp.float32))


class GatedDeltaNet(nnx.Module):
  """transformers' Qwen3_5GatedDeltaNet (its tensor names: grpo_jax/model/hf_io.py)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, C, K = cfg.hidden_size, channels(cfg), cfg.linear_conv_kernel
    Hv, Dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    pd, init = cfg.jnp_param_dtype, _normal(0.02)
    self.qkv_DxC = _param(rngs, init, (D, C), ("embed", "mlp"), pd)
    self.conv_KxC = _param(rngs, _normal(K ** -0.5), (K, C), (None, "mlp"), pd)
    self.z_DxHvxDv = _param(rngs, init, (D, Hv, Dv), ("embed", "q_heads", "head_dim"), pd)
    self.b_DxHv = _param(rngs, init, (D, Hv), ("embed", "q_heads"), pd)
    self.a_DxHv = _param(rngs, init, (D, Hv), ("embed", "q_heads"), pd)
    # Decay rates exp(A_log) spread over [1, 16] as transformers draws them, the time step's bias at 1.
    self.A_log_Hv = nnx.Param(jnp.log(jnp.linspace(1.0, 16.0, Hv)).astype(pd), out_sharding=("q_heads",),
                              eager_sharding=False)
    self.dt_bias_Hv = nnx.Param(jnp.ones((Hv,), pd), out_sharding=("q_heads",), eager_sharding=False)
    self.norm_Dv = nnx.Param(jnp.ones((Dv,), pd), out_sharding=("norm",), eager_sharding=False)
    self.out_HvxDvxD = _param(rngs, init, (Hv, Dv, D), ("q_heads", "head_dim", "embed"), pd)
    self.adapters = nnx.data(None)  # LoRA: a lora.LayerAdapters attached by lora.add_adapters

  def _project(self, name: str, x, w):
    y = jnp.einsum("btd,d...->bt...", x, w.astype(x.dtype))
    return y if self.adapters is None else self.adapters.add(name, x, y)

  def __call__(self, x_BxTxD, valid_BxT, cache: LinearCache | None):
    """-> (y [B, T, D], the new cache or None). `valid_BxT`: which tokens are real."""
    cfg = self.cfg
    dt = cfg.jnp_dtype
    B, T, _ = x_BxTxD.shape
    Hk, Dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
    Hv, Dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    x = jnp.where(valid_BxT[..., None], x_BxTxD, 0).astype(dt)
    qkv_BxTxC = self._project("in_proj_qkv", x, self.qkv_DxC[...])
    z_BxTxHvxDv = self._project("in_proj_z", x, self.z_DxHvxDv[...])
    b_BxTxHv = x @ self.b_DxHv[...].astype(dt)
    a_BxTxHv = x @ self.a_DxHv[...].astype(dt)

    K = cfg.linear_conv_kernel
    previous = (jnp.zeros((B, K - 1, qkv_BxTxC.shape[-1]), dt) if cache is None
                else cache.conv_BxKm1xC.astype(dt))
    window = jnp.concatenate([previous, qkv_BxTxC], axis=1)  # [B, K - 1 + T, C]
    w_KxC = self.conv_KxC[...].astype(dt)
    conv = sum(window[:, j:j + T] * w_KxC[j] for j in range(K))  # output t reads inputs t - K + 1 .. t
    mixed = jax.nn.silu(conv)
    q, k, v = jnp.split(mixed, [Hk * Dk, 2 * Hk * Dk], axis=-1)
    q, k, v = q.reshape(B, T, Hk, Dk), k.reshape(B, T, Hk, Dk), v.reshape(B, T, Hv, Dv)

    beta = jnp.where(valid_BxT[..., None], jax.nn.sigmoid(b_BxTxHv.astype(jnp.float32)), 0.0)
    g = -jnp.exp(self.A_log_Hv[...].astype(jnp.float32)) * jax.nn.softplus(
        a_BxTxHv.astype(jnp.float32) + self.dt_bias_Hv[...].astype(jnp.float32))
    g = jnp.where(valid_BxT[..., None], g, 0.0)
    state = None if cache is None else cache.state_BxHvxDkxDv
    rule = gated_delta.recurrent if T == 1 and cache is not None else gated_delta.chunked
    o_BxTxHvxDv, state = rule(q, k, v, g, beta, state)

    # Gated RMSNorm per value head (a plain scale, not an offset from 1), rounded as transformers rounds it.
    o = o_BxTxHvxDv.astype(dt).astype(jnp.float32)
    normed = (o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + cfg.rms_norm_eps)).astype(dt)
    y = self.norm_Dv[...].astype(jnp.float32) * normed.astype(jnp.float32)
    y = (y * jax.nn.silu(z_BxTxHvxDv.astype(jnp.float32))).astype(dt).reshape(B, T, Hv * Dv)
    out = y @ self.out_HvxDvxD[...].reshape(Hv * Dv, -1).astype(dt)
    if self.adapters is not None:
      out = self.adapters.add("out_proj", y, out)
    new_cache = None if cache is None else LinearCache(window[:, T:].astype(cache.conv_BxKm1xC.dtype), state)
    return out, new_cache
