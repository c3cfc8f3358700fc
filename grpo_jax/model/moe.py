"""Mixture-of-experts feed-forward (Qwen3-MoE, gpt-oss, Gemma 4): a router picks k of E gated-MLP experts per token.

Shape suffixes (as transformer.py): D hidden size, F one expert's hidden size, E experts, k = num_experts_per_tok,
T tokens (batch and length flattened), R = T * k routed rows.

Dropless: every token reaches its k experts, whatever the load. `ModelConfig.moe_impl` chooses how:
  "ragged": the R rows sorted by expert and multiplied by each expert's weights with `jax.lax.ragged_dot`
            (a grouped matmul: contiguous row groups, one weight matrix per group). TPUs run it natively; XLA:CPU
            expands it into a masked product over every expert (benchmarks/moe_bench.py measures it).
  "blocks": the sorted rows padded per expert to blocks of b rows, one batched matmul over the blocks with each
            block's expert weights gathered: the routed rows' cost (plus padding) on any backend.
  "auto":   "blocks" on a CPU, "ragged" elsewhere (the default).
  "dense":  every expert on every token, weighted by the routing (zero for experts not chosen): the reference.

Expert weights carry the logical axis 'expert' (grpo_jax/model/sharding.py maps it to the 'expert' mesh axis).
"""
from __future__ import annotations

import math

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
  if cfg.gemma4:  # GeGLU with the tanh GELU, as its MLP
    return jax.nn.gelu(gate, approximate=True) * up
  if cfg.swiglu_limit is None:
    return jax.nn.silu(gate) * up
  # gpt-oss's clamped gate (transformers' GptOssExperts._apply_gate).
  gate = jnp.minimum(gate, cfg.swiglu_limit)
  up = jnp.clip(up, -cfg.swiglu_limit, cfg.swiglu_limit)
  return gate * jax.nn.sigmoid(gate * cfg.swiglu_alpha) * (up + 1)


class MoE(nnx.Module):
  """Gemma 4's block (`cfg.gemma4`) routes from its own input (`__call__`'s `router_input_BxTxD`): RMS-normalized
  without a weight, times `router_scale_D` and D^-1/2; each chosen expert's weight is then multiplied by its
  `expert_scale_E`."""

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
    if cfg.shared_expert_size:  # Qwen3.5-MoE's shared expert and its gate
      S = cfg.shared_expert_size
      self.shared_gate_DxS = param(rngs, init, (D, S), ("embed", "mlp"), pd)
      self.shared_up_DxS = param(rngs, init, (D, S), ("embed", "mlp"), pd)
      self.shared_down_SxD = param(rngs, init, (S, D), ("mlp", "embed"), pd)
      self.shared_expert_gate_Dx1 = param(rngs, init, (D, 1), ("embed", None), pd)
    if cfg.gemma4:
      self.router_scale_D = nnx.Param(jnp.ones((D,), pd), out_sharding=("norm",), eager_sharding=False)
      self.expert_scale_E = nnx.Param(jnp.ones((E,), pd), out_sharding=(None,), eager_sharding=False)
    self.adapters = nnx.data(None)  # LoRA: a lora.ExpertAdapters attached by lora.add_adapters

  def router_logits(self, x_TxD):
    if self.cfg.gemma4:
      x_TxD = rms_normalize(x_TxD, self.cfg.rms_norm_eps) * self.router_scale_D[...].astype(x_TxD.dtype) * (
          self.cfg.hidden_size ** -0.5)
    logits = x_TxD @ self.router_DxE[...].astype(x_TxD.dtype)
    if self.cfg.expert_bias:
      logits = logits + self.router_bias_E[...].astype(x_TxD.dtype)
    return logits

  def __call__(self, x_BxTxD, experts_BxTxk=None, with_routing: bool = False, router_input_BxTxD=None):
    """[B, T, D] -> [B, T, D] (and with `with_routing`, (router logits [B, T, E] float32, the router's own top k
    [B, T, k], replayed or not)).
    `experts_BxTxk`: use these experts instead of the router's top k (routing replay), weighted by the router's
    probabilities of them (renormalized as the router would), so that gradients still reach the router.
    `router_input_BxTxD`: what the router reads, when not x (Gemma 4: the residual stream, x its normed copy)."""
    cfg = self.cfg
    B, T, D = x_BxTxD.shape
    x = x_BxTxD.reshape(B * T, D)
    logits = self.router_logits(x if router_input_BxTxD is None else router_input_BxTxD.reshape(B * T, D))
    weights, experts = own = route(logits, cfg)
    if experts_BxTxk is not None:
      experts = experts_BxTxk.reshape(B * T, -1).astype(jnp.int32)
      weights = replayed_weights(logits, experts, cfg)
    if cfg.gemma4:
      weights = weights * self.expert_scale_E[...].astype(jnp.float32)[experts]
    impl = cfg.moe_impl if cfg.moe_impl != "auto" else "blocks" if jax.default_backend() == "cpu" else "ragged"
    if impl == "dense":
      y = dense_experts(self, x, weights, experts)
    else:
      y = grouped_experts(self, x, weights, experts, blocks=impl == "blocks")
    if cfg.shared_expert_size:
      w = lambda name: getattr(self, name)[...].astype(x.dtype)
      shared = (jax.nn.silu(x @ w("shared_gate_DxS")) * (x @ w("shared_up_DxS"))) @ w("shared_down_SxD")
      y = y + (jax.nn.sigmoid(x @ w("shared_expert_gate_Dx1")) * shared).astype(y.dtype)
    y = y.reshape(B, T, D)
    if not with_routing:
      return y
    return y, (logits.astype(jnp.float32).reshape(B, T, -1), own[1].reshape(B, T, -1))

  def _weights(self, dt):
    p = {name: getattr(self, name)[...].astype(dt) for name in ("gate_ExDxF", "up_ExDxF", "down_ExFxD")}
    if self.cfg.expert_bias:
      p.update({name: getattr(self, name)[...].astype(dt) for name in ("gate_bias_ExF", "up_bias_ExF",
                                                                       "down_bias_ExD")})
    return p


def rms_normalize(x, eps: float):
  """x / rms(x) over the last axis in float32, cast back to x's dtype: an RMSNorm without a weight (Gemma 4's
  router input here, and its value norm in transformer.py)."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def replayed_weights(logits_TxE, experts_Txk, cfg: ModelConfig):
  """The router's weights of the given experts, as `route` would weigh them had it chosen them."""
  logits = logits_TxE.astype(jnp.float32)
  if cfg.router == "topk_softmax":
    return jax.nn.softmax(jnp.take_along_axis(logits, experts_Txk, axis=-1), axis=-1)
  weights = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), experts_Txk, axis=-1)
  return weights / jnp.sum(weights, axis=-1, keepdims=True) if cfg.norm_topk_prob else weights


def grouped_experts(moe: MoE, x_TxD, weights_Txk, experts_Txk, blocks: bool = False):
  """Dropless: the R = T * k (token, expert) rows sorted by expert, each row through its expert's MLP, then each
  token's k outputs summed with its routing weights. The rows meet their experts' weights through
  `jax.lax.ragged_dot` (contiguous groups), or with `blocks` in blocks of b rows that each belong to one expert
  (every group padded to a multiple of b; at most R / b + E blocks), one batched matmul over the blocks with the
  weights gathered per block: the cost of the routed rows (plus padding) on any backend."""
  cfg = moe.cfg
  T, k = experts_Txk.shape
  D, E, R = x_TxD.shape[1], cfg.num_experts, T * k
  experts_R = experts_Txk.reshape(-1)
  order_R = jnp.argsort(experts_R, stable=True)
  sorted_experts_R = experts_R[order_R]
  x_RxD = x_TxD[order_R // k]
  sizes_E = jnp.bincount(experts_R, length=E).astype(jnp.int32)
  if not blocks:
    y_RxD = _expert_mlp(moe, x_RxD, lambda x, w: jax.lax.ragged_dot(x, w, sizes_E), lambda b: b[sorted_experts_R])
  else:
    b = block_rows(R, E)
    n = -(-R // b) + E
    padded_E = -(-sizes_E // b) * b
    # Row r (the j-th of its expert e) goes to slot (e's padded offset) + j of the n * b padded rows.
    slot_R = (jnp.cumsum(padded_E) - padded_E)[sorted_experts_R] + jnp.arange(R) - (
        jnp.cumsum(sizes_E) - sizes_E)[sorted_experts_R]
    block_expert_N = jnp.minimum(jnp.searchsorted(jnp.cumsum(padded_E), jnp.arange(n) * b, side="right"), E - 1)
    x_NxbxD = jnp.zeros((n * b, D), x_TxD.dtype).at[slot_R].set(x_RxD).reshape(n, b, D)
    y_NxbxD = _expert_mlp(moe, x_NxbxD, lambda x, w: jnp.einsum("nbi,nio->nbo", x, w[block_expert_N]),
                          lambda bias: bias[block_expert_N][:, None])
    y_RxD = y_NxbxD.reshape(n * b, D)[slot_R]
  y_TxkxD = jnp.zeros_like(y_RxD).at[order_R].set(y_RxD).reshape(T, k, -1)
  return jnp.einsum("tkd,tk->td", y_TxkxD, weights_Txk.astype(y_RxD.dtype))


def block_rows(rows: int, experts: int) -> int:
  """b for `grouped_experts(blocks=True)`: about a quarter of an expert's mean rows, a power of 2 in [8, 256],
  so that the padding (at most E (b - 1) rows) stays near R / 4."""
  return int(min(256, max(8, 2 ** math.floor(math.log2(max(1, rows // (4 * experts)))))))


def _expert_mlp(moe: MoE, x, matmul, row_bias):
  """Each row of x through its expert's gated MLP; `matmul(x, w_ExIxO)` applies the row's expert's matrix and
  `row_bias(b_ExO)` gives the row's expert's bias, broadcastable against the result."""
  cfg, lora = moe.cfg, moe.adapters
  p = moe._weights(x.dtype)
  gate, up = matmul(x, p["gate_ExDxF"]), matmul(x, p["up_ExDxF"])
  if lora is not None:
    gate, up = lora.add("gate_proj", x, gate, matmul), lora.add("up_proj", x, up, matmul)
  if cfg.expert_bias:
    gate, up = gate + row_bias(p["gate_bias_ExF"]), up + row_bias(p["up_bias_ExF"])
  hidden = _activation(cfg, gate, up)
  y = matmul(hidden, p["down_ExFxD"])
  if lora is not None:
    y = lora.add("down_proj", hidden, y, matmul)
  return y + row_bias(p["down_bias_ExD"]) if cfg.expert_bias else y


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
