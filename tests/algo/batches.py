"""Shared test data for tests/algo: random rollout batches with padding, empty and length-1 completions; the
whole-batch loss."""
from __future__ import annotations

import numpy as np

from grpo_jax.algo import aggregation as agg
from grpo_jax.algo.objective import LossConfig, LossInputs, grpo_objective

# Policy-loss settings exercised against the reference (LossConfig keyword arguments).
CASES = {
    "token": dict(policy_loss="clipped", importance_level="token", epsilon_low=0.2),
    "clip_higher": dict(policy_loss="clipped", importance_level="token", epsilon_low=0.2, epsilon_high=0.28),
    "dual_clip": dict(policy_loss="clipped", importance_level="token", epsilon_low=0.2, delta=1.5),
    "gspo": dict(policy_loss="clipped", importance_level="sequence", epsilon_low=0.03, epsilon_high=0.04),
    "gspo_dual": dict(policy_loss="clipped", importance_level="sequence", epsilon_low=0.1, delta=1.2),
    "cispo": dict(policy_loss="cispo", importance_level="token", epsilon_low=0.2, cispo_epsilon_high=1.3),
}


def make_batch(seed: int, B: int = 8, T: int = 6, nan_padding: bool = True):
  """Random float32 per-token inputs; lengths always include 0, 1 and T. Padding holds NaN (it must not leak)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, T + 1, size=B)   # mostly real completions, plus the edge cases:
  lengths[:3] = [0, 1, T]
  rng.shuffle(lengths)
  mask = np.arange(T)[None, :] < lengths[:, None]
  logp = -rng.exponential(1.5, size=(B, T))                 # log-probs are <= 0
  old = logp + rng.normal(0.0, 0.5, size=(B, T))            # ratios well outside [0.8, 1.2] happen
  ref = logp + rng.normal(0.0, 0.7, size=(B, T))
  ent = rng.exponential(1.0, size=(B, T))
  adv = rng.normal(size=B)
  adv[rng.integers(B)] = 0.0
  out = dict(logp=logp, old=old, ref=ref, ent=ent)
  out = {k: v.astype(np.float32) for k, v in out.items()}
  if nan_padding:
    for k in out:
      out[k][~mask] = np.nan
  out.update(adv=adv.astype(np.float32), mask=mask, lengths=[int(n) for n in lengths])
  return out


def grpo_loss(inputs: LossInputs, cfg: LossConfig = LossConfig()):
  """(loss, metric means) of one whole batch: loss_sum / denom and sum / count (0 when empty)."""
  loss_sum, denom, metrics = grpo_objective(inputs, cfg)
  return agg.safe_divide(loss_sum, denom), {k: agg.safe_divide(s, c) for k, (s, c) in metrics.items()}
