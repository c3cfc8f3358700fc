"""The GRPO objective: policy term + β·KL − entropy_coef·H per token, aggregated as (sum, denominator).

For completion i of the rollout batch and its real tokens t (mask m_{i,t}):

    ℓ_{i,t} = sel_{i,t} · policy_{i,t}  +  β · KL_{i,t}  −  entropy_coef · H_{i,t}
    loss    = sum / denominator   with (sum, denominator) = aggregation(ℓ, m)

- policy_{i,t}: a registered policy loss (`policy_losses.py`: "clipped" = PPO/GRPO/DAPO/GSPO surrogate,
  "cispo"), or any function with that signature (`registry.py`).
- KL_{i,t}: `kl_estimator` ("k1", "k2", "k3"; `kl.py`) of π_θ against the frozen reference π_ref. Skipped
  when β = 0 or `ref_logp_BxT` is None (then the reference model need not run at all). When reference
  log-probs are given, the token mean of KL is reported as metric `kl` even if β = 0.
- H_{i,t}: the policy's token entropy (`entropy_BxT`, differentiable), needed for `entropy_coef` ≠ 0 and
  for `top_entropy_quantile` (sel_{i,t} = 1 on the top-q highest-entropy real tokens, else 0;
  `entropy.py`). Selection applies to the policy term only, as in TRL; it is computed over the tokens of one
  call, so with it a split batch is not exactly the whole batch.
- aggregation: `seq_mean_token_mean` | `token_mean` | `seq_mean_token_sum_norm` (`aggregation.py`).
- truncated importance sampling (`tis_cap` = C): the policy term of each token is weighted by
  w_{i,t} = min(π_old / π_sampler, C) (no gradient), which corrects for the sampler's log-probs differing from
  the trainer's at the same parameters (bfloat16 sampling, other kernels); as in TRL's
  `vllm_importance_sampling_correction` (cap 2 there) and verl's TIS. Needs `sampler_logp_BxT`.

With π_old = sg(π_θ) (μ = 1), `clipped` and k3 give ∂loss/∂logp_{i,t} = −(Â_i + β(π_ref/π_θ − 1)) · w_{i,t},
where w_{i,t} is the aggregation's weight of token t (1/(|o_i| G⁺), 1/Σ|o|, 1/(G⁺ C_max)): the gradient
coefficient of DeepSeekMath (Shao et al. 2024, arXiv:2402.03300) appendix A.1.6, negated because this is a
loss to minimize.

Split batches: `grpo_objective` returns (loss_sum, denom, metrics), where every metric is a (sum, count)
pair. For a rollout batch cut into micro-batches, add loss_sum, denom and each metric's parts over the
pieces (or their gradients: ∇loss = Σ_k ∇loss_sum_k / Σ_k denom_k), then divide: the result equals the
whole batch exactly. Advantages must be computed over the whole rollout batch beforehand.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from grpo_jax.algo import aggregation as agg
from grpo_jax.algo import kl as kl_lib
from grpo_jax.algo.corrections import CORRECTIONS, behaviour_ratio_metrics, get_correction
from grpo_jax.algo.entropy import top_entropy_mask
from grpo_jax.algo.registry import LOSSES, get_loss
from grpo_jax.config_checks import Section
from grpo_jax.settings import GrpoSettings, check_objective

_RUN = GrpoSettings  # a run's defaults (grpo_jax/settings.py), also the library's


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Every knob of the objective: the fields of a run's `grpo` section of the same names, documented with their
  defaults in grpo_jax/settings.py (GrpoSettings), and `max_completion_length`, C_max of seq_mean_token_sum_norm
  (None: the mask's width). Here policy_loss, kl_estimator and correction may also be functions (registry.py,
  kl.py: fn(logp, ref_logp) -> per-token kl, corrections.py). Frozen and hashable: a static jit argument."""
  policy_loss: str | Callable = _RUN.policy_loss
  epsilon_low: float = _RUN.epsilon_low
  epsilon_high: Optional[float] = _RUN.epsilon_high
  delta: Optional[float] = _RUN.delta
  importance_level: str = _RUN.importance_level
  cispo_epsilon_high: float = _RUN.cispo_epsilon_high
  kl_estimator: str | Callable = _RUN.kl_estimator
  beta: float = _RUN.beta
  entropy_coef: float = _RUN.entropy_coef
  top_entropy_quantile: Optional[float] = _RUN.top_entropy_quantile
  aggregation: str = _RUN.aggregation
  max_completion_length: Optional[int] = None  # the run's completion width (Settings.completion_width)
  tis_cap: Optional[float] = None              # None or 0: off
  correction: str | Callable = _RUN.correction

  def __post_init__(self):
    if not (isinstance(self.policy_loss, str) or callable(self.policy_loss)):
      raise ValueError(f"LossConfig.policy_loss must be a registered name or a function, got "
                       f"{self.policy_loss!r}")
    if self.tis_cap == 0:  # off, as a run's grpo.tis_cap = 0
      object.__setattr__(self, "tis_cap", None)
    check_objective(Section(self, "LossConfig", root=""))  # the ranges, as a run's grpo section has them
    kl_lib.get_kl_estimator(self.kl_estimator)
    agg.get_aggregation(self.aggregation)
    get_correction(self.correction)
    if self.max_completion_length is not None and (
        isinstance(self.max_completion_length, bool) or not isinstance(self.max_completion_length, int)
        or self.max_completion_length < 1):
      raise ValueError(f"LossConfig.max_completion_length must be a positive int or None, got "
                       f"{self.max_completion_length!r}")

  @classmethod
  def from_settings(cls, grpo: GrpoSettings, max_completion_length: int | None = None) -> "LossConfig":
    """From a run's `grpo` section (its loss knobs; tis_cap 0 is off); `max_completion_length` is the completion
    width of the run (Settings.completion_width)."""
    shared = {f.name: getattr(grpo, f.name) for f in dataclasses.fields(cls) if hasattr(grpo, f.name)}
    return cls(**shared, max_completion_length=max_completion_length)

  @property
  def resolved_epsilon_high(self) -> float:
    return self.epsilon_low if self.epsilon_high is None else self.epsilon_high

  @property
  def uses_kl(self) -> bool:
    return self.beta != 0.0

  @property
  def needs_entropy(self) -> bool:
    return self.entropy_coef != 0.0 or self.top_entropy_quantile is not None


def validate_config(grpo) -> None:
  """Checks that the loss's names in `grpo` (policy_loss, kl_estimator, aggregation) are registered (its numbers:
  grpo_jax/settings.py's GrpoSettings); raises ConfigError naming key and value."""
  for registry in (LOSSES, kl_lib.KL_ESTIMATORS, agg.AGGREGATIONS, CORRECTIONS):
    Section(grpo, "grpo").registered(registry)


class LossInputs(NamedTuple):
  """Per-token inputs of the objective for B completions padded to T tokens.

  logp_BxT: log π_θ of the sampled tokens (differentiable; at the sampling temperature).
  old_logp_BxT: log π_old (the sampler's), or None: π_old = stop_gradient(π_θ) (μ = 1).
  ref_logp_BxT: log π_ref, or None: no KL term.
  advantages_B: one advantage per completion (`advantages.compute_advantages`).
  mask_BxT: 1/True on real completion tokens (including the stop token), 0/False on padding.
  entropy_BxT: token entropies of π_θ (differentiable), or None; needed for the entropy options.
  sampler_logp_BxT: the log-probs the sampler reported for these tokens, or None; needed for `tis_cap`.
  """
  logp_BxT: jax.Array
  old_logp_BxT: Optional[jax.Array]
  ref_logp_BxT: Optional[jax.Array]
  advantages_B: jax.Array
  mask_BxT: jax.Array
  entropy_BxT: Optional[jax.Array] = None
  sampler_logp_BxT: Optional[jax.Array] = None


def _check_inputs(inputs: LossInputs, cfg: LossConfig):
  if not isinstance(cfg, LossConfig):
    raise TypeError(f"cfg must be a LossConfig, got {type(cfg).__name__}")
  shape = tuple(jnp.shape(inputs.logp_BxT))
  if len(shape) != 2:
    raise ValueError(f"logp_BxT must be [B, T], got shape {shape}")
  for name in ("old_logp_BxT", "ref_logp_BxT", "mask_BxT", "entropy_BxT", "sampler_logp_BxT"):
    value = getattr(inputs, name)
    if value is not None and tuple(jnp.shape(value)) != shape:
      raise ValueError(f"{name} has shape {tuple(jnp.shape(value))}, but logp_BxT has shape {shape}")
  if inputs.mask_BxT is None:
    raise ValueError("mask_BxT is required")
  if tuple(jnp.shape(inputs.advantages_B)) != shape[:1]:
    raise ValueError(f"advantages_B has shape {tuple(jnp.shape(inputs.advantages_B))}, expected ({shape[0]},) "
                     "(one advantage per completion)")
  if cfg.needs_entropy and inputs.entropy_BxT is None:
    raise ValueError("entropy_coef != 0 or top_entropy_quantile set, but entropy_BxT is None "
                     "(compute it with with_entropy=True)")
  if cfg.tis_cap is not None and inputs.sampler_logp_BxT is None:
    raise ValueError("tis_cap is set, but sampler_logp_BxT is None (the sampler's log-probs)")


def _clean(x_BxT, mask_BxT):
  # Padding may hold garbage (even NaN/inf); a select (not a multiply by 0) keeps it out of values and grads.
  return None if x_BxT is None else jnp.where(mask_BxT, x_BxT.astype(jnp.float32), 0.0)


def grpo_objective(inputs: LossInputs, cfg: LossConfig = LossConfig()):
  """(loss_sum, denom, metrics): the batch loss is loss_sum / denom; metrics map name -> (sum, count).

  Metrics: every metric of the policy loss (clip_ratio/low, high, region, ...), `policy_loss` (token mean of
  the policy term), `kl` (when ref_logp is given), `entropy` (when entropy is given), `entropy_selected`
  (fraction of tokens kept by top_entropy_quantile).
  """
  _check_inputs(inputs, cfg)
  mask = jnp.asarray(inputs.mask_BxT).astype(bool)
  logp = _clean(inputs.logp_BxT, mask)
  old = jax.lax.stop_gradient(logp) if inputs.old_logp_BxT is None else _clean(inputs.old_logp_BxT, mask)
  ref = _clean(inputs.ref_logp_BxT, mask)
  ent = _clean(inputs.entropy_BxT, mask)
  clean = LossInputs(logp, old, ref, jnp.asarray(inputs.advantages_B, jnp.float32), mask, ent)

  # The proximal policy (the trainer's at the update's start) against the behaviour policy (the sampler's).
  behav = _clean(inputs.sampler_logp_BxT, mask)
  ratio_to = get_correction(cfg.correction)
  clean_old, weight_BxT, correction_metrics = ratio_to(old, behav, mask, cfg)
  clean = clean._replace(old_logp_BxT=clean_old)
  policy_fn = get_loss(cfg.policy_loss)
  policy_BxT, metrics = policy_fn(clean, cfg)
  if tuple(jnp.shape(policy_BxT)) != mask.shape:
    raise ValueError(f"policy loss {cfg.policy_loss!r} returned shape {tuple(jnp.shape(policy_BxT))}, "
                     f"expected {mask.shape}")
  metrics = dict(metrics)
  metrics["policy_loss"] = agg.masked_sum_count(policy_BxT, mask)
  if weight_BxT is not None:
    policy_BxT = policy_BxT * weight_BxT
  metrics.update(correction_metrics)
  if behav is not None:
    metrics.update(behaviour_ratio_metrics(old, behav, mask))

  if cfg.top_entropy_quantile is not None:
    selected = top_entropy_mask(ent, mask, cfg.top_entropy_quantile)
    policy_BxT = jnp.where(selected, policy_BxT, 0.0)
    metrics["entropy_selected"] = agg.masked_sum_count(selected.astype(jnp.float32), mask)

  total_BxT = policy_BxT
  if ref is not None:
    kl_BxT = kl_lib.get_kl_estimator(cfg.kl_estimator)(logp, ref)
    metrics["kl"] = agg.masked_sum_count(kl_BxT, mask)
    if cfg.uses_kl:
      total_BxT = total_BxT + cfg.beta * kl_BxT
  if ent is not None:
    metrics["entropy"] = agg.masked_sum_count(ent, mask)
    if cfg.entropy_coef != 0.0:
      total_BxT = total_BxT - cfg.entropy_coef * ent

  loss_sum, denom = agg.aggregate(cfg.aggregation, total_BxT, mask, cfg.max_completion_length)
  metrics = {k: (jax.lax.stop_gradient(s), jax.lax.stop_gradient(c)) for k, (s, c) in metrics.items()}
  return loss_sum, denom, metrics
