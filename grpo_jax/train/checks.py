"""A run's config checked before anything is compiled: `validate(config)`, which returns the run's settings.

First the frozen settings tree is built (grpo_jax/settings.py: each section checks its own values, the root those that must agree
across sections), then what the settings cannot check themselves, by the module that owns it: names taken from
a registry (`validate_config` in grpo_jax/algo/advantages.py, objective.py, grpo_jax/envs, rewards/registry.py,
model/config.py, ...; the task's own checks through its plug-in, grpo_jax/data/tasks.py) and paths on disk. An
error reads `config.<key>=<value>: <what is allowed>`, a ConfigError (grpo_jax/config_checks.py).
The config itself is plain data (grpo_jax/config.py), below every layer; this module sits above the sections'
owners, so `train` (loop.py), the commands and the docs (`registries`) reach every check through it.
"""
from __future__ import annotations

from typing import Sequence

from grpo_jax import envs
from grpo_jax.algo import advantages, objective
from grpo_jax.data import tasks
from grpo_jax.model import config as model_config
from grpo_jax.model import lora
from grpo_jax.registry import REGISTRIES, Registry
from grpo_jax.rewards import registry as rewards
from grpo_jax.settings import Settings
from grpo_jax.train import eval_figures, warmstart  # noqa: F401 -- eval_figures: its FIGURES is in registries()


def registries() -> dict[str, Registry]:
  """Config key -> the Registry of the names it takes: every registry created by the modules this one imports
  (those `validate` checks with; a later one for a key replaces an earlier, e.g. a reloaded module's), for
  docs/config.md (scripts/config_reference.py)."""
  return {r.key: r for r in REGISTRIES}


def validate(config, in_memory_dataset: bool = False, reward_callables: Sequence[str] = ()) -> Settings:
  """Checks values and their consistency before any compile and returns the run's frozen settings; raises
  ConfigError (a ValueError) as `config.<key>=<value>: <what is allowed>` (module docstring). What a notebook passes
  to `train` besides the config (grpo_jax/train/inputs.py): `in_memory_dataset`, the task's rows come from
  `train_dataset` rather than its files; `reward_callables`, the names of its reward callables."""
  settings = Settings.from_config(config)  # each section checks its own values, then the root across sections
  # Names from registries above the base layer, and what needs the disk, by the modules that own them.
  advantages.validate_config(settings.grpo)
  objective.validate_config(settings.grpo)
  warmstart.validate_config(settings.warmstart)
  tasks.validate_config(settings, in_memory_dataset)
  envs.validate_config(settings.env)
  rewards.validate_config(settings, reward_callables)
  model_config.validate_config(settings.model)  # after the task's checks: those say what model.hf_path it needs
  lora.validate_config(settings.model)
  if not settings.model.hf_path:
    settings.check_context(settings.model.max_position_embeddings, "model.max_position_embeddings")
  return settings
