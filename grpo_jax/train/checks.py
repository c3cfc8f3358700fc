"""A run's config checked before anything is compiled: `validate(config)`.

First values set under an old key move to the new one (grpo_jax/config.py: `apply_renamed`), then each section is
checked by the module that consumes it (`validate_config` in grpo_jax/train/optim.py, grpo_jax/sampling/config.py,
...; the task's own checks through its plug-in, grpo_jax/data/tasks.py), then the values that must agree across
sections. An error reads `config.<key>=<value>: <what is allowed>`, a ConfigError (grpo_jax/config_checks.py).
The config itself is plain data (grpo_jax/config.py), below every layer; this module sits above the sections'
owners, so `train` (loop.py), the commands and the docs (`registries`) reach every check through it.
"""
from __future__ import annotations

from typing import Sequence

from grpo_jax import config as config_lib
from grpo_jax import envs, precision, sizes
from grpo_jax.algo import advantages, aggregation, kl, objective
from grpo_jax.algo import registry as losses
from grpo_jax.config_checks import Section, fail
from grpo_jax.data import tasks
from grpo_jax.model import config as model_config
from grpo_jax.model import lora, sharding
from grpo_jax.rewards import registry as rewards
from grpo_jax.sampling import config as sampling_config
from grpo_jax.train import checkpoint, distributed, evaluation, metrics, optim, run, warmstart


def registries() -> dict:
  """Config field -> the `grpo_jax.registry.Registry` of the names it takes (the single source of those names,
  for `validate` and docs/config.md)."""
  return {"grpo.advantage": advantages.ADVANTAGE_METHODS, "grpo.kl_estimator": kl.KL_ESTIMATORS,
          "grpo.aggregation": aggregation.AGGREGATIONS, "grpo.policy_loss": losses.LOSSES, "task.name": tasks.TASKS,
          "env.name": envs.ENVIRONMENTS, "rewards": rewards.REWARDS}


def validate(config, in_memory_dataset: bool = False, reward_callables: Sequence[str] = ()) -> None:
  """Checks values and their consistency before any compile; raises ConfigError (a ValueError) as
  `config.<key>=<value>: <what is allowed>` (module docstring). What a notebook passes to `train` besides the
  config (grpo_jax/train/inputs.py): `in_memory_dataset`, the task's rows come from `train_dataset` rather than
  its files; `reward_callables`, the names of its reward callables."""
  c = config
  config_lib.apply_renamed(c)
  _validate_run(c)
  # Each section by the module that consumes it.
  for owner, section in ((sampling_config, c.sampling), (run, c.grpo), (advantages, c.grpo), (objective, c.grpo),
                         (optim, c.optim), (warmstart, c.warmstart), (evaluation, c.eval),
                         (checkpoint, c.checkpoint), (metrics, c.log), (sharding, c.mesh),
                         (precision, c.precision), (distributed, c.distributed)):
    owner.validate_config(section)
  tasks.validate_config(c, in_memory_dataset)
  envs.validate_config(c.env)
  rewards.validate_config(c, reward_callables)
  model_config.validate_config(c.model)  # after the task's checks: those say what model.hf_path it needs
  lora.validate_config(c.model)
  _validate_across_sections(c)


def _validate_run(c) -> None:
  """The run's own top-level keys (the rewards: grpo_jax/rewards/registry.py)."""
  s = Section(c)
  s.at_least(1, "num_steps")
  s.one_of("reward_isolation", ("process", "thread"))
  s.positive("reward_timeout_s")


def _validate_across_sections(c) -> None:
  """Values that must agree across sections: batch sizes, widths and the context, LoRA and the reference."""
  B = sizes.rollout_batch_size(c)
  mini = sizes.mini_batch_size(c)
  if B % mini:
    fail("grpo.mini_batch_size", f"does not divide the rollout batch prompts_per_step * group_size = "
         f"{c.grpo.prompts_per_step} * {c.grpo.group_size} = {B}", mini)
  micro = sizes.micro_batch_size(c)
  if mini % micro:
    fail("grpo.micro_batch_size", f"does not divide the mini-batch size {mini}", micro)
  if c.grpo.overlong_buffer > c.sampling.max_new_tokens:
    fail("grpo.overlong_buffer", f"must be <= sampling.max_new_tokens={c.sampling.max_new_tokens}",
         c.grpo.overlong_buffer)
  if c.env.name and c.env.max_episode_tokens < c.sampling.max_new_tokens:
    fail("env.max_episode_tokens", f"cannot hold one message of sampling.max_new_tokens="
         f"{c.sampling.max_new_tokens}", c.env.max_episode_tokens)
  if c.model.lora_rank and c.grpo.ref_reset_every:
    fail("grpo.ref_reset_every", "is not supported with LoRA (model.lora_rank > 0): the reference is the base "
         "model with the adapters off", c.grpo.ref_reset_every)
  if not c.model.hf_path:
    sizes.check_context(c, c.model.max_position_embeddings, "model.max_position_embeddings")
