# The first ablation study: GRPO variants on the default task (2-digit addition, tiny model), 3 seeds each.
#   python scripts/sweep.py --config experiments/ablation_variants.py --sweep_dir runs/ablation_variants
#   python scripts/report.py runs/ablation_variants --out docs/ablations --title "GRPO variants"
# One member alone: add --only '^grpo_smtm_seed0$'; a job array: add --print_commands. Results: docs/ablations.md.
"""Advantage × aggregation, plus β = 0, DAPO and GSPO, on the default experiment made shorter.

Every member is the default experiment (experiments/default.py) with `STUDY` applied, then its own overrides:
  advantage × aggregation  grpo, dr_grpo, rloo × seq_mean_token_mean (smtm), token_mean (tm),
                           seq_mean_token_sum_norm (smtsn), at the default β = 0.04,
  grpo_smtm_beta0          the baseline (grpo, smtm) without the KL term,
  dapo                     clip-higher ε = 0.2 / 0.28, token_mean, β = 0 (no dynamic sampling: the trainer does
                           not implement it yet),
  gspo                     sequence-level importance ratio with ε = 3e-4 / 4e-4, smtm, β = 0.04.
β is varied on the baseline only, to keep the study small enough for a 2-core CPU.

Why two mini-batches per rollout (`grpo.mini_batch_size` = half the rollout batch): with a single on-policy
update the importance ratio is exactly 1, so clipping (DAPO's clip-higher, GSPO's sequence-level clip) would
never act and DAPO/GSPO would reduce to plain policy gradients by construction. With two updates per rollout,
the second one is off-policy and the clip ranges matter.
"""
import importlib.util
import os

from grpo_jax.ablation import spec

SEEDS = (0, 1, 2)
ROLLOUT_BATCH = 32 * 8   # prompts_per_step × group_size of the default experiment (checked in get_config)

# Applied to every member on top of experiments/default.py.
STUDY = {
    "num_steps": 150,
    "eval.every": 25,
    "grpo.mini_batch_size": ROLLOUT_BATCH // 2,
    "checkpoint.every": 50,
    "log.samples_every": 1000,
    "log.progress_bar": False,
    "log.plot": False,
}


def _default_experiment():
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py")
  module_spec = importlib.util.spec_from_file_location("_grpo_jax_default_experiment", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def _set(config, dotted_key, value):
  *parents, leaf = dotted_key.split(".")
  for part in parents:
    config = config[part]
  config[leaf] = value


def get_config():
  config = _default_experiment().get_config()
  rollout = config.grpo.prompts_per_step * config.grpo.group_size
  if rollout != ROLLOUT_BATCH:
    raise ValueError(f"experiments/default.py now has a rollout batch of {rollout}, not {ROLLOUT_BATCH}: "
                     "update ROLLOUT_BATCH in experiments/ablation_variants.py")
  for key, value in STUDY.items():
    _set(config, key, value)
  return config


AGGREGATIONS = {"smtm": "seq_mean_token_mean", "tm": "token_mean", "smtsn": "seq_mean_token_sum_norm"}


def get_sweep():
  members = spec.grid(spec.axis("grpo.advantage", ["grpo", "dr_grpo", "rloo"]),
                      spec.axis("grpo.aggregation", AGGREGATIONS), seeds=SEEDS)
  members += spec.grid(spec.variants({
      "grpo_smtm_beta0": {"grpo.advantage": "grpo", "grpo.aggregation": "seq_mean_token_mean",
                          "grpo.beta": 0.0},
      "dapo": {"grpo.advantage": "grpo", "grpo.aggregation": "token_mean", "grpo.beta": 0.0,
               "grpo.epsilon_low": 0.2, "grpo.epsilon_high": 0.28},
      "gspo": {"grpo.advantage": "grpo", "grpo.aggregation": "seq_mean_token_mean",
               "grpo.importance_level": "sequence", "grpo.epsilon_low": 3e-4, "grpo.epsilon_high": 4e-4},
  }), seeds=SEEDS)
  return members
