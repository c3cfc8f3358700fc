"""Environments of multi-turn episodes (base.py: the interface and the registry; calculator.py: a calculator tool,
a plug-in registered on the registry's first lookup)."""
from grpo_jax.config_checks import Section
from grpo_jax.envs.base import ENVIRONMENTS, Environment, StepResult, env_factory, register_env, stop_token_ids

__all__ = ["ENVIRONMENTS", "Environment", "StepResult", "env_factory", "register_env", "stop_token_ids",
           "validate_config"]


def validate_config(env) -> None:
  """Checks `config.env` (nothing when env.name is "", single-turn); raises ConfigError naming key and value.
  That an episode holds one message of sampling.max_new_tokens is the config's cross-section check."""
  s = Section(env, "env")
  if not s["name"]:
    return
  s.registered(ENVIRONMENTS)  # its numbers: grpo_jax/settings.py's EnvSettings
