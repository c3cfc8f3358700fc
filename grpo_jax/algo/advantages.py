"""Group-relative advantages: one scalar Â_i per completion, shared by all of its tokens.

For a prompt q, G completions o_1..o_G (a "group") get scalar rewards R_1..R_G. With the group mean
R̄ = (1/G) Σ_j R_j and the group standard deviation s = sqrt(Σ_j (R_j − R̄)² / (G − ddof)):

| method    | Â_i                                           | source |
|-----------|-----------------------------------------------|--------|
| `grpo`    | (R_i − R̄) / (s + eps)                         | DeepSeekMath (Shao et al. 2024, arXiv:2402.03300) §4.1.2 |
| `dr_grpo` | R_i − R̄                                       | Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): the std divisor biases toward too-easy/too-hard questions |
| `rloo`    | R_i − (1/(G−1)) Σ_{j≠i} R_j = G/(G−1)·(R_i − R̄) | RLOO (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740) |
| `batch`   | (R_i − R̄) / (S + eps), S the std of all (R_j − R̄_group(j)) of the batch | REINFORCE++-baseline (Hu 2025, arXiv:2501.03262) |

`std_ddof`: 1 (the sample std, as TRL and Tunix compute it; docs/algorithms.md's worked example: rewards 1,0,1,0
give ±0.866) or 0 (the population std: ±1). `eps` (default 1e-4, TRL's) only guards the division.
`batch` centres each group on its own mean and scales by the spread of those centred rewards over the whole
batch, so it stays invariant to adding a constant to one group (TRL's `scale_rewards="batch"` divides by the
std of the raw rewards instead, which is not).

A group whose rewards are all equal carries no signal: every member gets exactly 0.0 under every method
(enforced with a select, not left to float rounding of R_i − R̄). The fraction of such groups is the metric
`frac_reward_zero_std` (`frac_reward_zero_std`, `group_stats`).

Rewards arrive as [num_prompts * G] (each group contiguous) or [num_prompts, G]; the result is always the
flat float32 [num_prompts * G]. `group_size` and `method` are Python values (static under jit).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.config_checks import Section
from grpo_jax.registry import Registry

# name -> scale(centered_RxG, std_ddof, eps) -> [R, 1]: Â = (R_i − R̄) / scale, except in all-equal groups (0).
ADVANTAGE_METHODS = Registry("grpo.advantage", "advantage method")


def _groups_RxG(rewards, group_size) -> jax.Array:
  """Rewards as [num_prompts, G] float32, with clear errors for shapes that do not form groups."""
  if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}")
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim == 1:
    if rewards.shape[0] == 0 or rewards.shape[0] % group_size:
      raise ValueError(f"rewards has {rewards.shape[0]} entries, not a (positive) multiple of "
                       f"group_size={group_size}")
    return rewards.reshape(-1, group_size)
  if rewards.ndim == 2:
    if rewards.shape[1] != group_size or rewards.shape[0] == 0:
      raise ValueError(f"rewards has shape {tuple(rewards.shape)}; a 2-D rewards array must be "
                       f"[num_prompts, group_size={group_size}]")
    return rewards
  raise ValueError(f"rewards must be [num_prompts * G] or [num_prompts, G], got shape {tuple(rewards.shape)}")


def _check_ddof(std_ddof):
  if std_ddof not in (0, 1):
    raise ValueError(f"std_ddof must be 0 or 1, got {std_ddof!r}")


def _std(centered: jax.Array, ddof: int, axis) -> jax.Array:
  """Standard deviation of already-centred values; a single value has std 0 (not NaN) under ddof=1."""
  n = centered.size if axis is None else centered.shape[axis]
  return jnp.sqrt(jnp.sum(centered * centered, axis=axis) / max(n - ddof, 1))


class GroupStats(NamedTuple):
  """Per-group reward statistics, [num_prompts] each."""
  mean_R: jax.Array
  std_R: jax.Array
  zero_std_R: jax.Array  # bool: every reward of the group is equal (its advantages are all 0)


def group_stats(rewards, group_size: int, std_ddof: int = 1) -> GroupStats:
  """Mean, std (with `std_ddof`) and the all-equal flag of each group."""
  _check_ddof(std_ddof)
  r_RxG = _groups_RxG(rewards, group_size)
  mean_R = jnp.mean(r_RxG, axis=1)
  std_R = _std(r_RxG - mean_R[:, None], std_ddof, axis=1)
  return GroupStats(mean_R, std_R, jnp.max(r_RxG, axis=1) == jnp.min(r_RxG, axis=1))


def frac_reward_zero_std(rewards, group_size: int) -> jax.Array:
  """Fraction of groups whose rewards are all equal (scalar float32): the groups that give no gradient."""
  return jnp.mean(group_stats(rewards, group_size).zero_std_R.astype(jnp.float32))


@ADVANTAGE_METHODS.register("grpo")
def _grpo_scale(centered_RxG, std_ddof, eps):
  return _std(centered_RxG, std_ddof, axis=1)[:, None] + eps


@ADVANTAGE_METHODS.register("dr_grpo")
def _dr_grpo_scale(centered_RxG, std_ddof, eps):
  return jnp.ones((centered_RxG.shape[0], 1), jnp.float32)


@ADVANTAGE_METHODS.register("rloo")
def _rloo_scale(centered_RxG, std_ddof, eps):
  G = centered_RxG.shape[1]
  if G < 2:
    raise ValueError(f"rloo needs group_size >= 2 (the baseline is the mean of the other G-1 rewards), "
                     f"got group_size={G}")
  # R_i − mean_{j≠i} R_j = (G R_i − Σ_j R_j)/(G−1) = G/(G−1) · (R_i − R̄).
  return jnp.full((centered_RxG.shape[0], 1), (G - 1) / G, jnp.float32)


@ADVANTAGE_METHODS.register("batch")
def _batch_scale(centered_RxG, std_ddof, eps):
  return jnp.broadcast_to(_std(centered_RxG, std_ddof, axis=None) + eps, (centered_RxG.shape[0], 1))


METHODS = tuple(ADVANTAGE_METHODS)  # the built-in methods, in the table's order


def validate_config(grpo) -> None:
  """Checks that `grpo.advantage` names a registered method (its numbers: grpo_jax/settings.py's GrpoSettings);
  raises ConfigError naming key and value."""
  Section(grpo, "grpo").registered(ADVANTAGE_METHODS)


def compute_advantages(rewards, group_size: int, method: str = "grpo", std_ddof: int = 1,
                       eps: float = 1e-4) -> jax.Array:
  """Advantages [num_prompts * G] float32 from rewards [num_prompts * G] or [num_prompts, G].

  Raises ValueError for an unknown method, a std_ddof other than 0/1, a negative eps, rewards that do not
  split into groups of `group_size`, and `rloo` with group_size < 2 (no leave-one-out baseline exists).
  """
  scale = ADVANTAGE_METHODS.get(method)
  _check_ddof(std_ddof)
  if isinstance(eps, (int, float)) and not eps >= 0:  # a traced eps cannot be checked here
    raise ValueError(f"eps must be >= 0, got {eps!r}")
  r_RxG = _groups_RxG(rewards, group_size)
  centered_RxG = r_RxG - jnp.mean(r_RxG, axis=1, keepdims=True)
  all_equal_Rx1 = (jnp.max(r_RxG, axis=1) == jnp.min(r_RxG, axis=1))[:, None]
  scale_Rx1 = scale(centered_RxG, std_ddof, eps)

  # The select keeps equal groups at exactly 0 and the division free of 0/0 (eps may be 0).
  safe_scale_Rx1 = jnp.where(all_equal_Rx1 | (scale_Rx1 == 0), 1.0, scale_Rx1)
  adv_RxG = jnp.where(all_equal_Rx1, 0.0, centered_RxG / safe_scale_Rx1)
  return adv_RxG.reshape(-1).astype(jnp.float32)
