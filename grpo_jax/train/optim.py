"""The Optax optimizer of a run: global-norm clipping, then AdamW under a warmup + constant/cosine schedule.

The schedule counts optimizer updates; a GRPO step makes `updates_per_step = num_iterations *
(rollout batch / mini-batch)` of them, so warmup and decay lengths given in steps are scaled by it.
"""
from __future__ import annotations

import dataclasses

import optax

from grpo_jax.config_checks import Section


SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """`config.optim` as a typed value (grpo_jax/config.py documents each field); built once per run."""
  learning_rate: float = 3e-4
  schedule: str = "constant"      # one of SCHEDULES
  warmup_steps: int = 0           # GRPO steps
  min_lr_ratio: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0
  grad_clip_norm: float = 1.0     # 0: off

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"config.optim.schedule: unknown schedule {self.schedule!r} (known: {', '.join(SCHEDULES)})")

  @classmethod
  def from_config(cls, optim) -> "OptimConfig":
    """From the ml_collections `config.optim` (fields it lacks keep their defaults)."""
    if isinstance(optim, cls):
      return optim
    return cls(**{f.name: optim[f.name] for f in dataclasses.fields(cls) if f.name in optim})


def validate_config(optim) -> None:
  """Checks `config.optim` (grpo_jax/config.py documents each key); raises ConfigError naming key and value."""
  s = Section(optim, "optim")
  s.positive("learning_rate")
  s.one_of("schedule", SCHEDULES)
  s.at_least(0, "warmup_steps", "weight_decay", "grad_clip_norm")
  s.within("min_lr_ratio", 0, 1)


def learning_rate_schedule(optim_config: OptimConfig, num_steps: int, updates_per_step: int = 1) -> optax.Schedule:
  """Linear warmup from 0 to the peak over `warmup_steps` steps, then constant or cosine decay."""
  optim_config = OptimConfig.from_config(optim_config)
  peak = optim_config.learning_rate
  warmup = optim_config.warmup_steps * updates_per_step
  total = max(num_steps * updates_per_step, warmup + 1)
  if optim_config.schedule == "constant":
    after = optax.constant_schedule(peak)
  else:  # cosine
    after = optax.cosine_decay_schedule(peak, total - warmup, alpha=optim_config.min_lr_ratio)
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def make_optimizer(optim_config: OptimConfig, schedule: optax.Schedule) -> optax.GradientTransformation:
  optim_config = OptimConfig.from_config(optim_config)
  parts = []
  if optim_config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(optim_config.grad_clip_norm))
  parts.append(optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
                           weight_decay=optim_config.weight_decay))
  return optax.chain(*parts)
