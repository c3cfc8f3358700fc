"""Environments of multi-turn episodes (base.py: the interface; calculator.py: a calculator tool)."""
from grpo_jax.envs.base import ENVIRONMENTS, Environment, StepResult, env_factory, register_env, stop_token_ids
from grpo_jax.envs import calculator  # noqa: F401  (registers "calculator")

__all__ = ["ENVIRONMENTS", "Environment", "StepResult", "env_factory", "register_env", "stop_token_ids"]
