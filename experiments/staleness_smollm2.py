# Rollouts ahead of the update on a real model: SmolLM2-135M-Instruct on sums asked in English (10 GRPO steps).
#   bash scripts/get_smollm2.sh     # once
#   python scripts/sweep.py --config experiments/staleness_smollm2.py --sweep_dir runs/staleness_smollm2
#   python scripts/report.py runs/staleness_smollm2 --baseline sync --mean_of offpolicy/ratio_std,clip_ratio/region
# About 15 min per member on a 2-core CPU. The study on the default task: experiments/staleness.py.
"""Staleness 0 against staleness 4 with the decoupled objective and with naive clipping, on
experiments/smollm2_arithmetic.py (one update per step, beta 0, lr 1e-5): does the real model's slower drift
change the default task's finding (naive held accuracy at k = 4, decoupled lost it)? With 10 steps and k = 4,
steps 1-5 learn from batches of the starting policy and steps 6-10 from batches 4 updates old."""
from grpo_jax.sweep import spec

SEEDS = (0, 1)


def get_config(preset=None):
  config = spec.sibling_experiment(__file__, "smollm2_arithmetic.py").get_config(preset)
  config.log.progress_bar = False
  return config


def get_sweep():
  members = spec.grid(spec.variants({
      "sync": {"rollout.staleness": 0},
      "k4_decoupled": {"rollout.staleness": 4, "grpo.correction": "proximal", "grpo.tis_cap": 2.0},
      "k4_naive": {"rollout.staleness": 4, "grpo.correction": "behaviour", "grpo.tis_cap": 0.0},
  }), seeds=SEEDS)
  return spec.order_by_seed(members)
