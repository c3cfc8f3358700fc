# Rollouts ahead of the update on the default task: staleness k = 0, 1, 2, 4 x three off-policy corrections, 3 seeds.
#   python scripts/sweep.py --config experiments/staleness.py --sweep_dir runs/staleness
#   python scripts/report.py runs/staleness --out docs/staleness --baseline sync \
#     --mean_of offpolicy/ratio_std,logp_mismatch,clip_ratio/region --title "Staleness x correction, default task"
# A smoke test of the pipeline at tiny shapes: --config experiments/staleness.py:test
"""Does an off-policy correction hold accuracy when the sampler runs k updates ahead of the update?

Every member is the default experiment (experiments/default.py: 500 GRPO steps, G = 8 x 32 prompts, one update per
step, beta = 0) with `rollout.staleness` = k: update t learns from the batch the policy after t - 1 - k updates
sampled (the first k steps from the starting policy). Groups:
  sync           k = 0 (the default experiment itself; at k = 0 the three corrections coincide up to the sampler's
                 rounding, ~1e-7 in log-probability on the CPU),
  k<k>_decoupled the ratio against the policy at the update's start, each token weighted by
                 min(pi_proximal / pi_behaviour, 2): AReaL's decoupled objective (grpo.tis_cap = 2),
  k<k>_ignored   the same ratio without the weight: staleness ignored,
  k<k>_naive     the ratio against the sampler's own log-probs (grpo.correction = behaviour): PPO's clipping as if
                 the behaviour policy were the old one, the baseline that lost accuracy at k = 4 in AReaL.
With one update per batch (the default experiment's) the ratio to the proximal policy is exactly 1, so the
proximal corrections never clip: the clip only acts from the second update on a batch. AReaL's runs take several
mini-batch updates per batch; the groups ending in `_mb2` split each batch into two mini-batches (two updates per
step, the second one clipped against the proximal policy), with their own synchronous baseline `sync_mb2`.
Every member starts from the warm start of `sync` with its seed (warmstart.init_checkpoint: the same state).
"""
from grpo_jax.sweep import spec

SEEDS = (0, 1, 2)
STALENESS = (1, 2, 4)
CORRECTIONS = {"decoupled": {"grpo.correction": "proximal", "grpo.tis_cap": 2.0},
               "ignored": {"grpo.correction": "proximal", "grpo.tis_cap": 0.0},
               "naive": {"grpo.correction": "behaviour", "grpo.tis_cap": 0.0}}


def get_config(preset=None):
  config = spec.sibling_experiment(__file__, "default.py").get_config(preset)
  config.log.progress_bar = False
  config.log.plot = False
  return config


def get_sweep():
  options = {"sync": {"rollout.staleness": 0}}
  for k in STALENESS:
    for name, overrides in CORRECTIONS.items():
      options[f"k{k}_{name}"] = {"rollout.staleness": k, **overrides}
  half = {"grpo.mini_batch_size": 128}  # 32 prompts x G 8 = 256 completions: two mini-batches
  options["sync_mb2"] = {"rollout.staleness": 0, **half}
  for name in ("decoupled", "naive"):
    options[f"k4_{name}_mb2"] = {"rollout.staleness": 4, **CORRECTIONS[name], **half}
  members = spec.grid(spec.variants(options), seeds=SEEDS)
  members = spec.share_warm_start(members, donor_group="sync")
  return spec.order_by_seed(members)
