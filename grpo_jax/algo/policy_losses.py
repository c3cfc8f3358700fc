"""Per-token policy terms: the part of the GRPO loss that carries the advantage.

Each is a registered policy loss `fn(inputs, cfg) -> (per_token_loss_BxT, metrics)` (signature and input
contract in `registry.py`). They return a loss to minimize, i.e. minus the surrogate objective.

Importance ratio (π_old is the policy that sampled the rollout; with μ = 1 it is sg(π_θ) and the ratio is 1,
but its gradient is not 0):
  token level                  r_{i,t} = exp(logp_{i,t} − old_logp_{i,t})
  sequence level (GSPO)        s_i = exp((1/|o_i|) Σ_t (logp_{i,t} − old_logp_{i,t})), the same for all t
    (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071; the paper clips s_i with
    ε = 3e-4 / 4e-4, far smaller than the token-level 0.2; set `epsilon_low`/`epsilon_high` accordingly.)

`clipped` — the PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) as GRPO uses it
(DeepSeekMath Eq. 3), with r the token or sequence ratio (`cfg.importance_level`):
    ℓ = −min(r·Â, clip(r, 1 − ε_low, 1 + ε_high)·Â)
  - ε_high ≠ ε_low is DAPO's "clip-higher" (Yu et al. 2025, arXiv:2503.14476: 0.2 / 0.28).
  - dual clip `delta` = δ > 1 (Ye et al. 2020, arXiv:1912.09729; INTELLECT-2; verl `clip_ratio_c`): for
    Â < 0 the loss r·|Â| is otherwise unbounded in r, so it is capped at δ·|Â|:
        ℓ = min(−min(r·Â, clip(r)·Â), −δ·Â)   when Â < 0.
  Metrics (token-weighted fractions of real tokens, TRL's definitions — the tokens whose gradient the clip
  removed): `clip_ratio/low` = [r < 1 − ε_low and Â < 0], `clip_ratio/high` = [r > 1 + ε_high and Â > 0],
  `clip_ratio/region` = either; with δ also `clip_ratio/dual` = [r > δ and Â < 0].
  Clipping never raises the objective: min(r·Â, clip(r)·Â) ≤ r·Â; the dual clip only lowers the loss of
  tokens that the first clip left unbounded.

`cispo` — Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585): clip the importance
weight, not the update, and stop its gradient, so no token loses its gradient:
    ℓ = −sg(min(r, cispo_epsilon_high)) · Â · logp
  `cispo_epsilon_high` is the cap on r itself (TRL's `epsilon_high` for `loss_type="cispo"`; 5.0 is
  the value TRL recommends, ScaleRL's ε_max). The loss value is not comparable to `clipped`'s; its gradient,
  sg(min(r, cap))·Â·∇logp (negated), is the point. MiniMax-M1 pairs it with `token_mean` aggregation.
  Token level only. Metric: `clip_ratio/high` = `clip_ratio/region` = [r > cap] (any sign of Â:
  truncation rescales every such token), `clip_ratio/low` = 0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.algo.aggregation import masked_sum_count
from grpo_jax.algo.registry import register_loss


def importance_log_ratio(logp_BxT, old_logp_BxT, mask_BxT, level: str = "token") -> jax.Array:
  """log r per token [B, T]: token-level log ratios, or each row's mean log ratio (GSPO) broadcast over T.

  Masked positions give log ratio 0 at token level; an empty row gives 0 at sequence level.
  """
  mask = mask_BxT.astype(bool)
  log_ratio_BxT = jnp.where(mask, logp_BxT - old_logp_BxT, 0.0)
  if level == "token":
    return log_ratio_BxT
  if level == "sequence":
    lengths_B = jnp.maximum(jnp.sum(mask, axis=-1), 1).astype(jnp.float32)
    seq_B = jnp.sum(log_ratio_BxT, axis=-1) / lengths_B
    return jnp.broadcast_to(seq_B[:, None], log_ratio_BxT.shape)
  raise ValueError(f"importance_level must be 'token' or 'sequence', got {level!r}")


def _fraction(flag_BxT, mask_BxT):
  return masked_sum_count(flag_BxT.astype(jnp.float32), mask_BxT)


@register_loss("clipped")
def clipped_surrogate(inputs, cfg):
  """PPO/GRPO clipped surrogate, token- or sequence-level ratio, optional dual clip. See the module doc."""
  mask = inputs.mask_BxT
  adv_Bx1 = inputs.advantages_B[:, None].astype(jnp.float32)
  ratio_BxT = jnp.exp(importance_log_ratio(inputs.logp_BxT, inputs.old_logp_BxT, mask, cfg.importance_level))
  eps_low, eps_high = cfg.epsilon_low, cfg.resolved_epsilon_high
  clipped_BxT = jnp.clip(ratio_BxT, 1.0 - eps_low, 1.0 + eps_high)
  loss_BxT = -jnp.minimum(ratio_BxT * adv_Bx1, clipped_BxT * adv_Bx1)
  if cfg.delta is not None:
    loss_BxT = jnp.where(adv_Bx1 < 0, jnp.minimum(loss_BxT, -cfg.delta * adv_Bx1), loss_BxT)

  low = (ratio_BxT < 1.0 - eps_low) & (adv_Bx1 < 0)
  high = (ratio_BxT > 1.0 + eps_high) & (adv_Bx1 > 0)
  metrics = {
      "clip_ratio/low": _fraction(low, mask),
      "clip_ratio/high": _fraction(high, mask),
      "clip_ratio/region": _fraction(low | high, mask),
  }
  if cfg.delta is not None:
    metrics["clip_ratio/dual"] = _fraction((ratio_BxT > cfg.delta) & (adv_Bx1 < 0), mask)
  return loss_BxT, metrics


@register_loss("cispo")
def cispo(inputs, cfg):
  """CISPO: −sg(min(r, cispo_epsilon_high))·Â·logp per token. See the module doc."""
  if cfg.importance_level != "token":
    raise ValueError(f"policy_loss='cispo' is defined with token-level ratios; got "
                     f"importance_level={cfg.importance_level!r}")
  mask = inputs.mask_BxT
  adv_Bx1 = inputs.advantages_B[:, None].astype(jnp.float32)
  ratio_BxT = jnp.exp(importance_log_ratio(inputs.logp_BxT, inputs.old_logp_BxT, mask, "token"))
  weight_BxT = jax.lax.stop_gradient(jnp.minimum(ratio_BxT, cfg.cispo_epsilon_high))
  loss_BxT = -weight_BxT * adv_Bx1 * inputs.logp_BxT
  truncated = ratio_BxT > cfg.cispo_epsilon_high
  metrics = {
      "clip_ratio/low": _fraction(jnp.zeros_like(truncated), mask),
      "clip_ratio/high": _fraction(truncated, mask),
      "clip_ratio/region": _fraction(truncated, mask),
  }
  return loss_BxT, metrics
