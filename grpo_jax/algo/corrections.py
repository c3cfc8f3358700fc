"""Off-policy corrections: what the policy ratio is taken against when the batch was sampled by an older policy.

Three policies meet in an update: the behaviour policy π_behav that sampled the batch (its log-probs are the
sampler's, `sampler_logp_BxT`), the proximal policy π_prox (the trainer's own log-probs at the parameters the
update starts from: `old_logp_BxT`, or stop_gradient(π_θ) with one update per batch) and π_θ. With rollouts k
updates ahead of the update (`rollout.staleness` = k) π_behav is π_prox of k updates ago; with k = 0 they differ
only by the sampler's numerics (bfloat16 sampling, other kernels). π_behav is per token: with rollouts that span
updates (`rollout.decode_budget`, grpo_jax/train/partial.py) each token's log-prob is that of the policy that
sampled it, and a correction reads it token by token like any other.

A correction is a pure function, registered by name (`grpo.correction`):

    fn(prox_logp_BxT, behav_logp_BxT, mask_BxT, cfg) -> (old_logp_BxT, weight_BxT or None, metrics)

`old_logp_BxT` is what the policy loss's ratio π_θ / π_old divides by; `weight_BxT` (no gradient, 0 on padding)
multiplies each token's policy term; `metrics` map name -> (sum, count). Inputs arrive cleaned (0.0 on padding).

- "proximal" (the default): the ratio against π_prox; with `tis_cap` = C > 0 each token's term is also
  weighted by min(π_prox / π_behav, C). That pair is AReaL's decoupled PPO objective (Fu et al. 2025,
  arXiv:2505.24298), and at k = 0 it is truncated importance sampling (TRL's, verl's TIS); with C = 0 the
  staleness is ignored.
- "behaviour": the ratio against π_behav, with no weight: PPO's clipping as if the sampler's policy were the
  old one, the baseline that lost accuracy at staleness 4 in AReaL.

A notebook adds its own (M2PO's second-moment token masking, IcePop's two-sided mask, ...) with
`register_correction("name")(fn)`.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.algo import aggregation as agg
from grpo_jax.registry import Registry

CORRECTIONS = Registry("grpo.correction", "off-policy correction", objects=True)


def register_correction(name: str, *, overwrite: bool = False):
  """Decorator that registers a correction under `name` and returns it unchanged."""
  return CORRECTIONS.register(name, overwrite=overwrite)


def get_correction(name_or_fn: str | Callable) -> Callable:
  return CORRECTIONS.get(name_or_fn)


@CORRECTIONS.register("proximal")
def proximal(prox_logp_BxT, behav_logp_BxT, mask_BxT, cfg):
  """The ratio against π_prox; with cfg.tis_cap, the truncated weight min(π_prox / π_behav, tis_cap)."""
  if cfg.tis_cap is None:
    return prox_logp_BxT, None, {}
  if behav_logp_BxT is None:
    raise ValueError("tis_cap is set, but sampler_logp_BxT is None (the sampler's log-probs)")
  weight_BxT = jnp.minimum(jnp.exp(prox_logp_BxT - behav_logp_BxT), cfg.tis_cap)
  weight_BxT = jax.lax.stop_gradient(jnp.where(mask_BxT, weight_BxT, 0.0))
  return prox_logp_BxT, weight_BxT, {
      "tis/weight": agg.masked_sum_count(weight_BxT, mask_BxT),
      "tis/capped": agg.masked_sum_count((weight_BxT >= cfg.tis_cap).astype(jnp.float32), mask_BxT)}


@CORRECTIONS.register("behaviour")
def behaviour(prox_logp_BxT, behav_logp_BxT, mask_BxT, cfg):
  """The ratio against π_behav (the sampler's log-probs), no weight."""
  if behav_logp_BxT is None:
    raise ValueError("correction 'behaviour' needs sampler_logp_BxT (the sampler's log-probs)")
  return behav_logp_BxT, None, {}


def behaviour_ratio_metrics(prox_logp_BxT, behav_logp_BxT, mask_BxT) -> dict:
  """The spread of the importance ratio r = π_prox / π_behav over real tokens: means of r and r² as (sum, count)
  pairs (the loop reports the mean and the standard deviation)."""
  r_BxT = jnp.where(mask_BxT, jnp.exp(prox_logp_BxT - behav_logp_BxT), 0.0)
  return {"offpolicy/ratio": agg.masked_sum_count(r_BxT, mask_BxT),
          "offpolicy/ratio_sq": agg.masked_sum_count(r_BxT * r_BxT, mask_BxT)}
