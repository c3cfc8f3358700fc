# The default experiment trained through LoRA adapters instead of all weights.
#   python scripts/train.py --config experiments/lora.py --workdir runs/lora                   # one run
#   python scripts/sweep.py --config experiments/lora.py --sweep_dir runs/lora_vs_full          # the comparison
#   python scripts/report.py runs/lora_vs_full --out docs/lora --baseline full --title "LoRA vs full fine-tuning"
# A smoke test at tiny shapes: --config experiments/lora.py:test.
"""2-digit addition as in experiments/default.py (same warm start, same GRPO settings), but GRPO trains only
rank-8 adapters (alpha 32) on all seven projections of every layer, the base weights frozen (grpo_jax/model/lora.py).
Adapters learn with a larger step than full fine-tuning: Adam lr 1e-3 instead of 3e-4.

The sweep (`get_sweep`), 3 seeds each, every member starting from the `full` member's warm start of its seed
(a LoRA run's starting point is a base model, saved in the same layout as a full fine-tuning run's):
  full      experiments/default.py as it is (lr 3e-4)
  lora_r8   adapters of rank 8, lr 1e-3
  lora_r1   adapters of rank 1, lr 1e-3 (Schulman et al. 2025, "LoRA Without Regret": RL needs very little rank)
"""
from grpo_jax.sweep import spec

SEEDS = (0, 1, 2)


def get_config(preset: str | None = None):
  c = spec.sibling_experiment(__file__, "default.py").get_config(preset)
  c.model.lora_rank = 8
  c.model.lora_alpha = 32.0
  c.model.lora_targets = "all"
  c.optim.learning_rate = 1e-3
  c.log.progress_bar = False
  return c


def get_sweep():
  members = spec.grid(spec.variants({
      "full": {"model.lora_rank": 0, "optim.learning_rate": 3e-4},
      "lora_r8": {"model.lora_rank": 8},
      "lora_r1": {"model.lora_rank": 1},
  }), seeds=SEEDS)
  members = spec.share_warm_start(members, donor_group="full")
  return spec.order_by_seed(members)
