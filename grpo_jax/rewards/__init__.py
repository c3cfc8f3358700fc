"""Verifiable rewards: registry, safe weighted scoring, and the built-in verifiers (registered on import)."""
from grpo_jax.rewards.registry import get_reward, list_rewards, register_reward
from grpo_jax.rewards.scoring import RewardResult, score_completions
from grpo_jax.rewards.exact import exact_match
from grpo_jax.rewards.gsm8k import extract_gsm8k_prediction, gsm8k_accuracy, gsm8k_gold
from grpo_jax.rewards.math_answer import (extract_math_prediction, make_math_accuracy, math_accuracy,
                                          math_answers_equal, math_verify_accuracy, normalize_math_answer)
from grpo_jax.rewards.format_rewards import (format_lenient, format_strict, gate_on_format,
                                             make_format_reward)
from grpo_jax.rewards.countdown import countdown, evaluate_expression, make_countdown_reward
from grpo_jax.rewards.overlong import make_overlong_reward, soft_overlong_penalty
from grpo_jax.rewards.reasoning_gym import reasoning_gym_score
from grpo_jax.rewards.reasoning_tags import (reasoning_answer_graded, reasoning_answer_number, reasoning_format,
                                             reasoning_format_tags)
