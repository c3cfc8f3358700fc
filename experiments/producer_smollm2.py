# The producer's decodes on a real model: SmolLM2-135M-Instruct on sums asked in English (10 GRPO steps), accuracy
# against wall-clock for the static decode, continuous batching and continuous batching with rollouts that span
# updates.
#   bash scripts/get_smollm2.sh     # once
#   python scripts/sweep.py --config experiments/producer_smollm2.py --sweep_dir runs/producer_smollm2
#   python scripts/report.py runs/producer_smollm2 --baseline static --wall_clock \
#     --mean_of sampling/slot_utilization,timing/sample_s
# About 10 min per member on a 2-core CPU (9 members); docs/ablations.md has the results.
"""Static decoding (every row of a batch until the longest stops), continuous batching on 16 slots
(`sampling.slots`: the same completions up to float rounding, which differs with the rows a decode step runs, so
the runs drift apart after a few steps), and continuous batching with rollouts that span updates
(`rollout.decode_budget` 24 of the 48 new tokens, `rollout.staleness` 1: a completion's first 24 tokens by the
policy one update older, the rest by the newest), on experiments/smollm2_arithmetic.py; 3 seeds each."""
from grpo_jax.sweep import spec

SEEDS = (0, 1, 2)


def get_config(preset=None):
  config = spec.sibling_experiment(__file__, "smollm2_arithmetic.py").get_config(preset)
  config.log.progress_bar = False
  return config


def get_sweep():
  members = spec.grid(spec.variants({
      "static": {},
      "continuous": {"sampling.slots": 16},
      "partial_k1": {"sampling.slots": 16, "rollout.staleness": 1, "rollout.decode_budget": 24},
  }), seeds=SEEDS)
  return spec.order_by_seed(members)
