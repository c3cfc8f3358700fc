"""The Optax optimizer of a run: global-norm clipping, then AdamW under a warmup + constant/cosine schedule.

The schedule counts optimizer updates; a GRPO step makes `updates_per_step = num_iterations *
(rollout batch / mini-batch)` of them, so warmup and decay lengths given in steps are scaled by it.
"""
from __future__ import annotations

import optax

from grpo_jax.settings import OptimSettings


def learning_rate_schedule(optim_config: OptimSettings, num_steps: int, updates_per_step: int = 1) -> optax.Schedule:
  """Linear warmup from 0 to the peak over `warmup_steps` steps, then constant or cosine decay."""
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


def make_optimizer(optim_config: OptimSettings, schedule: optax.Schedule) -> optax.GradientTransformation:
  clip = [optax.clip_by_global_norm(optim_config.grad_clip_norm)] if optim_config.grad_clip_norm > 0 else []
  return optax.chain(*clip, optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
                                        weight_decay=optim_config.weight_decay))
