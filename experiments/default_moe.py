# python scripts/train.py --config experiments/default_moe.py --workdir runs/default_moe
# Tiny test preset: python scripts/train.py --config experiments/default_moe.py:test --workdir /tmp/grpo_moe_test
"""The default experiment (2-digit addition, character tokens, supervised warm start to 30%, then 500 GRPO steps)
with a mixture of experts in place of each MLP: 8 experts of 128 units, 2 per token, so that a token's active
parameters equal the dense default's (an MLP of 256 units). A fresh MoE model is a small Qwen3-MoE (q/k norms,
softmax top-k router, weights renormalized); the results: docs/models.md."""
from grpo_jax.sweep import spec


def get_config(preset: str | None = None):
  c = spec.sibling_experiment(__file__, "default.py").get_config(preset)
  c.moe.num_experts = 8
  c.moe.experts_per_token = 2
  c.moe.intermediate_size = c.model.intermediate_size // 2
  return c
