# The first ablation study: GRPO variants on the default task (2-digit addition, tiny model), 4 seeds each.
#   python scripts/sweep.py --config experiments/ablation_variants.py --sweep_dir runs/ablation_variants
#   python scripts/report.py runs/ablation_variants --out docs/ablations --baseline grpo_smtm \
#     --mean_of clip_ratio/region,entropy,dynamic_sampling/rounds,dynamic_sampling/filled_groups,frac_reward_zero_std \
#     --groups '^(?!grpo_smtm_replica$)' --title "GRPO variants on the default task"
# One member alone: add --only '^grpo_smtm_seed0$'; a job array: --print_commands. Results: docs/ablations.md.
# A smoke test of the whole pipeline at tiny shapes: --config experiments/ablation_variants.py:test
"""Advantage × aggregation, plus β > 0, DAPO and GSPO, on the default experiment made shorter.

Every member is the default experiment (experiments/default.py: β = 0, Adam lr 3e-4, G = 8 × 32 prompts) with
`STUDY` applied, then its own overrides:
  <adv>_<agg>        advantage grpo | dr_grpo | rloo × aggregation seq_mean_token_mean (smtm) | token_mean (tm)
                     | seq_mean_token_sum_norm (smtsn), at the default experiment's β = 0,
  grpo_smtm_kl0.04   the baseline (grpo, smtm) with the KL penalty β = 0.04 (k3, DeepSeekMath),
  dapo               clip-higher ε = 0.2 / 0.28, token_mean, β = 0, dynamic sampling (zero-std groups replaced by
                     groups of further prompts, at most grpo.dynamic_sampling_max_rounds = 4 sampler calls a step),
  gspo               sequence-level importance ratio with ε = 3e-4 / 4e-4 (GSPO paper), smtm, β = 0,
  grpo_smtm_replica  a control (seed 0 only): the baseline again, started from the baseline's step-0 checkpoint.
β is varied on the baseline only, to keep the study small enough for a 2-core CPU.

Two mini-batches per rollout (`grpo.mini_batch_size` = half the rollout batch, μ = 1): with a single on-policy
update the importance ratio is exactly 1, so clipping (DAPO's clip-higher, GSPO's sequence-level clip) would
never act and DAPO/GSPO would be plain policy gradients by construction. With two updates per rollout, the
second is off-policy and the clip ranges matter.

Shared warm start: the warm start depends only on the seed and on settings no member changes, so every member
with β = 0 starts from the warm start of `grpo_smtm` with the same seed (`warmstart.init_checkpoint`: exactly
the state it would have computed itself; see grpo_jax/sweep/runner.py:init_overrides). The β > 0 members
keep their own warm start (as when the study was first run). Members run seed-major: seed 0 of every group first.
"""
from grpo_jax.sweep import spec

SEEDS = (0, 1, 2, 3)
NUM_STEPS = 100

# Applied to every member on top of experiments/default.py.
STUDY = {
    "num_steps": NUM_STEPS,
    "eval.every": 25,
    # Checkpoints at steps 0 and NUM_STEPS only, so that step 0 (the shared warm start) is kept (keep = 2).
    "checkpoint.every": NUM_STEPS,
    "checkpoint.keep": 2,
    "log.samples_every": 50,
    "log.progress_bar": False,
    "log.plot": False,
}


def get_config(preset=None):
  config = spec.sibling_experiment(__file__, "default.py").get_config(preset)
  for dotted_key, value in STUDY.items():
    *parents, leaf = dotted_key.split(".")
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = value
  if preset == "test":
    config.num_steps = config.checkpoint.every = 2
  config.grpo.mini_batch_size = config.grpo.prompts_per_step * config.grpo.group_size // 2
  return config


AGGREGATIONS = {"smtm": "seq_mean_token_mean", "tm": "token_mean", "smtsn": "seq_mean_token_sum_norm"}


def get_sweep():
  members = spec.grid(spec.axis("grpo.advantage", ["grpo", "dr_grpo", "rloo"]),
                      spec.axis("grpo.aggregation", AGGREGATIONS), seeds=SEEDS)
  members += spec.grid(spec.variants({
      "grpo_smtm_kl0.04": {"grpo.advantage": "grpo", "grpo.aggregation": "seq_mean_token_mean",
                           "grpo.beta": 0.04},
      "dapo": {"grpo.advantage": "grpo", "grpo.aggregation": "token_mean", "grpo.beta": 0.0,
               "grpo.epsilon_low": 0.2, "grpo.epsilon_high": 0.28, "grpo.dynamic_sampling": True},
      "gspo": {"grpo.advantage": "grpo", "grpo.aggregation": "seq_mean_token_mean", "grpo.beta": 0.0,
               "grpo.importance_level": "sequence", "grpo.epsilon_low": 3e-4, "grpo.epsilon_high": 4e-4},
  }), seeds=SEEDS)
  # An A/A control on one seed: the baseline's exact config, started from the baseline's step-0 checkpoint like
  # every other member. Any difference to grpo_smtm would be nondeterminism or an inexact resume.
  members += spec.grid(spec.variants({"grpo_smtm_replica": {"grpo.advantage": "grpo",
                                                            "grpo.aggregation": "seq_mean_token_mean"}}),
                       seeds=SEEDS[:1])
  members = spec.share_warm_start(members, donor_group="grpo_smtm", exclude=["grpo_smtm_kl0.04"])
  return spec.order_by_seed(members)
