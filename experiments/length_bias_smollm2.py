# Dr. GRPO's length bias on a real model: SmolLM2-135M-Instruct on sums asked in English (10 GRPO steps).
#   bash scripts/get_smollm2.sh     # once
#   pilot (seeds 0, 1; ~30 min on 2 cores):
#     python scripts/sweep.py --config experiments/length_bias_smollm2.py --sweep_dir runs/length_bias_pilot --only '_seed[01]$'
#     python scripts/report.py runs/length_bias_pilot --baseline grpo --mean_of completions/mean_length_incorrect --plan
#   the study (seeds 2-6, the planned test below; ~75 min on 2 cores, or on Ray with --backend ray):
#     python scripts/sweep.py --config experiments/length_bias_smollm2.py --sweep_dir runs/length_bias_smollm2 --only '_seed[2-6]$'
#     python scripts/report.py runs/length_bias_smollm2 --baseline grpo --out docs/ablations/length_bias_smollm2 \
#       --mean_of completions/mean_length_incorrect,completions/mean_length_correct,completions/mean_length \
#       --curves completions/mean_length_incorrect,completions/mean_length_correct
"""Dr. GRPO's length bias (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783) on experiments/smollm2_arithmetic.py, the real model that is verbose out of the box (its wrong
answers average 39 of the 48 tokens allowed, many cut off).

Why this effect and this task: GRPO divides each completion's summed token loss by its own length, so a long wrong
completion pays a smaller penalty per token than a short one; Dr. GRPO sums token losses over a constant
(max_new_tokens) and drops the std scaling of the advantages. The prediction concerns the completions' length,
which the policy chooses freely here (48 tokens, the model's own chat template), and needs no long training:
the length moves from the first steps (39 -> 33 tokens in 10 steps of the recipe). The toy model showed it
(docs/ablations.md, the second study); a 10-step run costs about 7 minutes on the 2-core CPU, so 5 seeds of two
arms fit in the ~3 hours of CPU the study may take. DAPO's clip-higher needs off-policy updates that this
recipe's one update per step never makes (the ratio stays 1 and no clip binds).

Planned test, written before the main runs (seeds 2-6; seeds 0 and 1 are the pilot, reported apart):
  primary   the mean over steps of `completions/mean_length_incorrect` (tokens of the training completions with
            reward 0), paired by seed: dr_grpo - grpo < 0, a two-sided t test over the 5 same-seed
            differences at alpha 0.05 (docs/ablations.md: reproduced if p < 0.05 with the predicted sign).
  secondary (exploratory, Holm-adjusted with the primary in the report's table) final held-out greedy accuracy,
            the mean lengths of correct and of all completions.
Both arms: beta 0, one update per step, 8 prompts x G 8, lr 1e-5, 10 steps; evaluation at steps 0 and 10 only
and no transfer sets (their time goes to seeds).
"""
from grpo_jax.sweep import spec

PILOT_SEEDS = (0, 1)
SEEDS = (2, 3, 4, 5, 6)


def get_config(preset=None):
  config = spec.sibling_experiment(__file__, "smollm2_arithmetic.py").get_config(preset)
  config.log.progress_bar = False
  config.task.transfer = ""
  config.eval.every = 10
  config.checkpoint.every = 5
  return config


def get_sweep():
  members = spec.grid(spec.variants({
      "grpo": {"grpo.advantage": "grpo", "grpo.aggregation": "seq_mean_token_mean"},
      "dr_grpo": {"grpo.advantage": "dr_grpo", "grpo.aggregation": "seq_mean_token_sum_norm"},
  }), seeds=PILOT_SEEDS + SEEDS)
  return spec.order_by_seed(members)
