"""Mixture-of-experts feed-forward (Qwen3-MoE, gpt-oss): a router picks k of E gated-MLP experts per token.

Shape suffixes (as transformer.py): D hidden size, F one expert's hidden size, E experts, k = num_experts_per_tok,
T tokens (batch and length flattened), R = T * k routed rows.

Dropless: every token reaches its k experts, whatever the load. `ModelConfig.moe_impl` chooses how:
  "ragged": the R rows sorted by expert and multiplied by each expert's weights with `jax.lax.ragged_dot`
            (a grouped matmul: contiguous row groups, one weight matrix per group). TPUs run it natively; XLA:CPU
            expands it into a masked product over every expert (benchmarks/moe_bench.py measures both).
  "dense":  every expert on every token, weighted by the routing (zero for experts not chosen): the reference.

Expert weights carry the logical axis 'expert' (grpo_jax/model/sharding.py maps it to the 'expert' mesh axis).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax.model.config import ModelConfig
from grpo_jax.model.initializers import normal, param, zeros


def route(logits_TxE, cfg: ModelConfig):
  """(weights_Txk float32, experts_Txk int32) of each token's k experts (`config.ROUTERS`)."""
  logits = logits_TxE.astype(jnp.float32)
  k = cfg.num_experts_per_tok
  if cfg.router == "topk_softmax":
    top, experts = jax.lax.top_k(logits, k)
    return jax.nn.softmax(top, axis=-1), experts
  weights, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
  if cfg.norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts


def expert_load(experts_Txk, num_experts: int, valid_T=None):
  """Max over mean routed tokens per expert (1 = perfectly balanced, E / k at worst); `valid_T` masks padding."""
  one_hot = jax.nn.one_hot(experts_Txk, num_experts, dtype=jnp.float32).sum(1)
  if valid_T is not None:
    one_hot = one_hot * valid_T[:, None]
  counts_E = one_hot.sum(0)
  return jnp.max(counts_E) / jnp.maximum(jnp.mean(counts_E), 1e-9)


def load_balancing_loss(logits_NxE, experts_Nxk, valid_N):
  """Switch Transformer's auxiliary loss (Fedus et al. 2021, arXiv:2101.03961, eqs. 4-6), as transformers'
  load_balancing_loss_func computes it: E * sum_e f_e P_e over the valid tokens, f_e the expert's share of the
  token-picks (summing to k), P_e its mean router probability. k at a uniform router; larger when unbalanced."""
  E = logits_NxE.shape[-1]
  valid = valid_N.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(valid), 1.0)
  f_E = jnp.sum(jax.nn.one_hot(experts_Nxk, E, dtype=jnp.float32).sum(1) * valid[:, None], 0) / n
  p_E = jnp.sum(jax.nn.softmax(logits_NxE.astype(jnp.float32), -1) * valid[:, None], 0) / n
  return E * jnp.sum(f_E * p_E)


def router_z_loss(logits_NxE, valid_N):
  """ST-MoE's router z-loss (Zoph et al. 2022, arXiv:2202.08906, eq. 5): the mean over valid tokens of
  logsumexp(router logits)^2, which keeps the logits small."""
  valid = valid_N.astype(jnp.float32)
  z = jax.nn.logsumexp(logits_NxE.astype(jnp.float32), axis=-1)
  return jnp.sum(z * z * valid) / jnp.maximum(jnp.sum(valid), 1.0)


def _activation(cfg: ModelConfig, gate, up):
  if cfg.swiglu_limit is None:
    return jax.nn.silu(gate) * up
  # gpt-oss's clamped gate (transformers' GptOssExperts._apply_gate).
  gate = jnp.minimum(gate, cfg.swiglu_limit)
  up = jnp.clip(up, -cfg.swiglu_limit, cfg.swiglu_limit)
  return gate * jax.nn.sigmoid(gate * cfg.swiglu_alpha) * (up + 1)


class MoE(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, F, E, pd = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.jnp_param_dtype
    init = normal(0.02)
    self.router_DxE = param(rngs, init, (D, E), ("embed", None), pd)
    self.gate_ExDxF = param(rngs, init, (E, D, F), ("expert", "embed", "mlp"), pd)
    self.up_ExDxF = param(rngs, init, (E, D, F), ("expert", "embed", "mlp"), pd)
    self.down_ExFxD = param(rngs, init, (E, F, D), ("expert", "mlp", "embed"), pd)
    if cfg.expert_bias:
      self.router_bias_E = param(rngs, zeros, (E,), (None,), pd)
      self.gate_bias_ExF = param(rngs, zeros, (E, F), ("expert", "mlp"), pd)
      self.up_bias_ExF = param(rngs, zeros, (E, F), ("expert", "mlp"), pd)
      self.down_bias_ExD = param(rngs, zeros, (E, D), ("expert", "embed"), pd)
    self.adapters = nnx.data(None)  # LoRA: a lora.ExpertAdapters attached by lora.add_adapters

  def router_logits(self, x_TxD):
    logits = x_TxD @ self.router_DxE[...].astype(x_TxD.dtype)
    if self.cfg.expert_bias:
      logits = logits + self.router_bias_E[...].astype(x_TxD.dtype)
    return logits

  def __call__(self, x_BxTxD, experts_BxTxk=None, with_routing: bool = False):
    """[B, T, D] -> [B, T, D] (and with `with_routing`, (router logits [B, T, E] float32, experts [B, T, k])).
    `experts_BxTxk`: use these experts instead of the router's top k (routing replay), weighted by the router's
    probabilities of them (renormalized as the router would), so that gradients still reach the router."""
    cfg = self.cfg
    B, T, D = x_BxTxD.shape
    x = x_BxTxD.reshape(B * T, D)
    logits = self.router_logits(x)
    weights, experts = route(logits, cfg)
    if experts_BxTxk is not None:
      experts = experts_BxTxk.reshape(B * T, -1)
      weights = replayed_weights(logits, experts, cfg)
    ffn = dense_experts if cfg.moe_impl == "dense" else grouped_experts
    y = ffn(self, x, weights, experts).reshape(B, T, D)
    if not with_routing:
      return y
    return y, (logits.astype(jnp.float32).reshape(B, T, -1), experts.reshape(B, T, -1))

  def _weights(self, dt):
    p = {name: getattr(self, name)[...].astype(dt) for name in ("gate_ExDxF", "up_ExDxF", "down_ExFxD")}
    if self.cfg.expert_bias:
      p.update({name: getattr(self, name)[...].astype(dt) for name in ("gate_bias_ExF", "up_bias_ExF",
                                                                       "down_bias_ExD")})
    return p


def replayed_weights(logits_TxE, experts_Txk, cfg: ModelConfig):
  """The router's weights of the given experts, as `route` would weigh them had it chosen them."""
  logits = logits_TxE.astype(jnp.float32)
  if cfg.router == "topk_softmax":
    return jax.nn.softmax(jnp.take_along_axis(logits, experts_Txk, axis=-1), axis=-1)
  weights = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), experts_Txk, axis=-1)
  return weights / jnp.sum(weights, axis=-1, keepdims=True) if cfg.norm_topk_prob else weights


def grouped_experts(moe: MoE, x_TxD, weights_Txk, experts_Txk):
  """Dropless: the R = T * k (token, expert) rows sorted by expert, two grouped matmuls, then each token's k
  outputs summed with its routing weights."""
  cfg = moe.cfg
  T, k = experts_Txk.shape
  p = moe._weights(x_TxD.dtype)
  experts_R = experts_Txk.reshape(-1)
  order_R = jnp.argsort(experts_R, stable=True)
  sorted_experts_R = experts_R[order_R]
  x_RxD = x_TxD[order_R // k]
  sizes_E = jnp.bincount(experts_R, length=cfg.num_experts).astype(jnp.int32)
  lora = moe.adapters
  gate = jax.lax.ragged_dot(x_RxD, p["gate_ExDxF"], sizes_E)
  up = jax.lax.ragged_dot(x_RxD, p["up_ExDxF"], sizes_E)
  if lora is not None:
    gate = lora.add_grouped("gate_proj", x_RxD, gate, sizes_E)
    up = lora.add_grouped("up_proj", x_RxD, up, sizes_E)
  if cfg.expert_bias:
    gate, up = gate + p["gate_bias_ExF"][sorted_experts_R], up + p["up_bias_ExF"][sorted_experts_R]
  hidden_RxF = _activation(cfg, gate, up)
  y_RxD = jax.lax.ragged_dot(hidden_RxF, p["down_ExFxD"], sizes_E)
  if lora is not None:
    y_RxD = lora.add_grouped("down_proj", hidden_RxF, y_RxD, sizes_E)
  if cfg.expert_bias:
    y_RxD = y_RxD + p["down_bias_ExD"][sorted_experts_R]
  y_TxkxD = jnp.zeros_like(y_RxD).at[order_R].set(y_RxD).reshape(T, k, -1)
  return jnp.einsum("tkd,tk->td", y_TxkxD, weights_Txk.astype(y_RxD.dtype))


def dense_experts(moe: MoE, x_TxD, weights_Txk, experts_Txk):
  """Reference: every expert on every token, [T, E, F] activations, combined with zero weight off the top k."""
  cfg = moe.cfg
  p = moe._weights(x_TxD.dtype)
  combine_TxE = jnp.zeros((x_TxD.shape[0], cfg.num_experts), jnp.float32).at[
      jnp.arange(x_TxD.shape[0])[:, None], experts_Txk].add(weights_Txk)
  lora = moe.adapters
  gate = jnp.einsum("td,edf->tef", x_TxD, p["gate_ExDxF"])
  up = jnp.einsum("td,edf->tef", x_TxD, p["up_ExDxF"])
  if lora is not None:
    gate, up = lora.add_dense("gate_proj", x_TxD, gate), lora.add_dense("up_proj", x_TxD, up)
  if cfg.expert_bias:
    gate, up = gate + p["gate_bias_ExF"], up + p["up_bias_ExF"]
  hidden = _activation(cfg, gate, up)
  y = jnp.einsum("tef,efd->ted", hidden, p["down_ExFxD"])
  if lora is not None:
    y = lora.add_dense("down_proj", hidden, y)
  if cfg.expert_bias:
    y = y + p["down_bias_ExD"]
  return jnp.einsum("ted,te->td", y, combine_TxE.astype(y.dtype))
