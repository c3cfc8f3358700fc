# The second ablation study: completions whose length the policy chooses.
#   python scripts/train.py --config experiments/chain_sum.py --workdir runs/chain_sum           # one run
#   python scripts/sweep.py --config experiments/chain_sum.py --sweep_dir runs/ablation_chain_sum  # the study
#   python scripts/report.py runs/ablation_chain_sum --out docs/ablations/chain_sum --baseline grpo \
#     --mean_of entropy,completions/mean_length_incorrect,completions/mean_length_correct,clip_ratio/high \
#     --title "Length normalisation and clip-higher on chain sums"
# A smoke test at tiny shapes: --config experiments/chain_sum.py:test. Results: docs/ablations.md.
"""Sums of 3-8 single digits ("4+7+2+9=" -> "22") that the model may write out as running sums
("11,13,22"): the completion's last comma-separated field is the answer (reward `final_field_match`), so a
completion is 2 to 21 characters long and its length is the policy's choice. The warm start imitates written-out
answers for half the prompts and bare sums for the other half, then stops at 30% held-out greedy accuracy;
GRPO takes it from there.

Four updates per rollout batch (mini-batches of 64 rows, mu = 1): only the first is on-policy, so the ratio
moves away from 1 and the clip range acts (with one update it never would).

The sweep (`get_sweep`), 8 seeds each, every member starting from the `grpo` member's warm start of its seed:
  grpo          std-scaled advantages, per-sequence length normalisation (seq_mean_token_mean), eps 0.2 / 0.2
  dr_grpo       Dr. GRPO: mean-centred advantages, token sums over a constant (seq_mean_token_sum_norm)
  clip_higher   grpo with DAPO's clip-higher, eps 0.2 / 0.28
Predictions, written before the runs (docs/ablations.md has the outcome):
  1. Dr. GRPO's length bias (Liu et al. 2025, arXiv:2503.20783): normalising by each completion's length
     penalises a long wrong completion less per token than a short one, so under `grpo` the incorrect
     completions are longer than under `dr_grpo`.
  2. DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476): a wider upper clip lets unlikely tokens gain
     probability, so the policy's entropy falls more slowly under `clip_higher` than under `grpo`.
"""
from grpo_jax.sweep import spec

SEEDS = (0, 1, 2, 3, 4, 5, 6, 7)


def get_config(preset: str | None = None):
  if preset not in (None, "", "test"):
    raise ValueError(f"experiments/chain_sum.py: unknown preset {preset!r} (known: test)")
  # experiments/default.py's model, warm start, optimizer and evaluation (its tiny shapes for "test").
  c = spec.sibling_experiment(__file__, "default.py").get_config(preset)
  c.task.name = "chain_sum"
  c.task.min_terms = 3
  c.task.max_terms = 8
  c.task.scratchpad_fraction = 0.5
  c.rewards = {"final_field_match": 1.0}
  c.eval.accuracy_reward = "final_field_match"
  c.sampling.max_prompt_length = 16
  c.sampling.max_new_tokens = 24
  c.model.max_position_embeddings = 64
  c.grpo.mini_batch_size = 64          # 4 updates per rollout batch
  c.checkpoint.keep = 2

  if preset == "test":
    # The same structure (warm start, 4 mini-batches, the chain_sum reward) in 2 steps.
    c.num_steps = 2
    c.grpo.mini_batch_size = 4
    c.eval.every = 1
    c.log.samples_every = 1
  else:
    c.num_steps = 150
    c.warmstart.eval_every = 25
    c.warmstart.max_steps = 3000
    c.checkpoint.every = c.num_steps   # steps 0 (the shared warm start) and the last are kept
  return c


def get_sweep():
  members = spec.grid(spec.variants({
      "grpo": {"grpo.advantage": "grpo", "grpo.aggregation": "seq_mean_token_mean"},
      "dr_grpo": {"grpo.advantage": "dr_grpo", "grpo.aggregation": "seq_mean_token_sum_norm"},
      "clip_higher": {"grpo.advantage": "grpo", "grpo.aggregation": "seq_mean_token_mean",
                      "grpo.epsilon_high": 0.28},
  }), seeds=SEEDS)
  members = spec.share_warm_start(members, donor_group="grpo")
  return spec.order_by_seed(members)
