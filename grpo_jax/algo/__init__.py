"""What GRPO and its variants compute, as pure jnp functions (jit- and vmap-friendly).

One rollout batch: B = num_prompts · G completions, padded to T tokens, with per-token log-probs under the
current policy π_θ, the policy that sampled it, the one the update starts from and the frozen reference π_ref.

1. `advantages.py`  rewards [num_prompts·G] -> one advantage per completion: grpo, dr_grpo, rloo, batch.
2. `corrections.py` off-policy corrections: the π_old of the ratio and a per-token weight (proximal, behaviour).
3. `policy_losses.py` per-token policy term: PPO-clipped surrogate (token level, or sequence level = GSPO;
   DAPO clip-higher; dual clip) and CISPO; clip statistics.
4. `kl.py`          per-token KL estimators k1, k2, k3 against π_ref.
5. `entropy.py`     token entropy; top-entropy-quantile token selection.
6. `aggregation.py` per-token losses -> (sum, denominator): seq_mean_token_mean, token_mean,
                    seq_mean_token_sum_norm; exact over micro-batches.
7. `objective.py`   `grpo_objective(LossInputs, LossConfig)`: all of the above, one call.
8. `registry.py`    policy losses by name; a user's own function plugs in by name or by object.

Semantics and sources: docs/algorithms.md (DeepSeekMath arXiv:2402.03300, DAPO arXiv:2503.14476,
Dr. GRPO arXiv:2503.20783, GSPO arXiv:2507.18071, CISPO/MiniMax-M1 arXiv:2506.13585, RLOO arXiv:2402.14740).
"""
from grpo_jax.algo import aggregation, advantages, entropy, kl, objective, policy_losses, registry
from grpo_jax.algo.advantages import GroupStats, compute_advantages, frac_reward_zero_std, group_stats
from grpo_jax.algo.aggregation import aggregate, masked_sum_count, safe_divide
from grpo_jax.algo.entropy import entropy_from_logits, top_entropy_mask
from grpo_jax.algo.kl import get_kl_estimator
from grpo_jax.algo.objective import LossConfig, LossInputs, grpo_objective
from grpo_jax.algo.policy_losses import cispo, clipped_surrogate, importance_log_ratio
from grpo_jax.algo.registry import get_loss, list_losses, register_loss

__all__ = [
    "GroupStats", "LossConfig", "LossInputs", "aggregate", "aggregation", "advantages", "cispo",
    "clipped_surrogate", "compute_advantages", "entropy", "entropy_from_logits", "frac_reward_zero_std",
    "get_kl_estimator", "get_loss", "grpo_objective", "group_stats", "importance_log_ratio", "kl",
    "list_losses", "masked_sum_count", "objective", "policy_losses", "register_loss", "registry",
    "safe_divide", "top_entropy_mask",
]
