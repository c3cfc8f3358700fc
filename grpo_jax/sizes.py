"""What a run's config implies, computed from it where needed: batch sizes, the completion width, the context
check, the weighted rewards. The config's keys and defaults are grpo_jax/config.py's; these read a config (the
ConfigDict, or anything with the same fields) and import nothing above the base layer, so the config's checks
(grpo_jax/train/checks.py), train/ and rewards/ share them.
"""
from __future__ import annotations

import math

from grpo_jax.config_checks import fail


def rollout_batch_size(config) -> int:
  return config.grpo.prompts_per_step * config.grpo.group_size


def mini_batch_size(config) -> int:
  return config.grpo.mini_batch_size or rollout_batch_size(config)


def micro_batch_size(config) -> int:
  return config.grpo.micro_batch_size or mini_batch_size(config)


def prompt_repeats(config) -> int:
  """Rows per prompt forward in the update and the reference: gcd(micro-batch, G) with
  `model.share_prompt_forward` (every aligned run of that many rows lies in one group), else 1."""
  if not config.model.get("share_prompt_forward", True):
    return 1
  return math.gcd(micro_batch_size(config), config.grpo.group_size)


def completion_width(config) -> int:
  """Columns of a completion in the update: env.max_episode_tokens with an environment, else
  sampling.max_new_tokens."""
  env = config.get("env")
  return env.max_episode_tokens if env is not None and env.name else config.sampling.max_new_tokens


def check_context(config, context: int, source: str) -> None:
  """max_prompt_length + max_new_tokens (+ the episode's width with an environment) must fit in the model's
  context (also called for HF checkpoints)."""
  total = config.sampling.max_prompt_length + config.sampling.max_new_tokens
  width = completion_width(config)
  if width != config.sampling.max_new_tokens and config.sampling.max_prompt_length + width > context:
    fail("env.max_episode_tokens", f"max_prompt_length + max_episode_tokens = {config.sampling.max_prompt_length}"
         f" + {width} exceeds the model's context {source}={context}", width)
  if total > context:
    fail("sampling.max_new_tokens", f"max_prompt_length + max_new_tokens = {config.sampling.max_prompt_length}"
         f" + {config.sampling.max_new_tokens} = {total} exceeds the model's context {source}={context}",
         config.sampling.max_new_tokens)


def configured_rewards(config) -> dict[str, float]:
  """Every reward of the run, name (registered name or import path) -> weight: `rewards`, then `reward_funcs`."""
  weights = list(config.reward_weights) or [1.0] * len(config.reward_funcs)
  return {**{name: float(w) for name, w in config.rewards.items()},
          **{name: float(w) for name, w in zip(config.reward_funcs, weights)}}
