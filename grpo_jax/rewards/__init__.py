"""Verifiable rewards: registry, safe weighted scoring, and the built-in verifiers (registered on import)."""
from grpo_jax.rewards.registry import get_reward, list_rewards, register_reward
from grpo_jax.rewards.scoring import RewardResult, score_completions
from grpo_jax.rewards.exact import exact_match
