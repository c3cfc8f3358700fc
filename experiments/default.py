# bash scripts/run_default.sh
#   (= python scripts/train.py --config experiments/default.py --workdir runs/default)
# Tiny test preset: python scripts/train.py --config experiments/default.py:test --workdir /tmp/grpo_test
"""The default experiment: 2-digit addition ("37+45=" -> "82" + stop), character tokens, a 2-layer d=64
transformer. A supervised warm start stops at the first held-out greedy accuracy >= 30%; GRPO (G=8 x 32
prompts, exact-match reward, beta=0, Adam lr 3e-4) then raises it. Runs in 82 s on 2 CPU cores (docs/results.md)."""
from grpo_jax import config as base


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 0
  c.num_steps = 500
  c.task.name = "addition"
  c.task.num_digits = 2
  c.rewards = {"exact_match": 1.0}
  c.sampling.max_prompt_length = 8
  c.sampling.max_new_tokens = 4
  c.sampling.temperature = 1.0

  c.grpo.group_size = 8
  c.grpo.prompts_per_step = 32
  c.grpo.beta = 0.0
  c.grpo.aggregation = "seq_mean_token_mean"
  c.optim.learning_rate = 3e-4
  c.optim.grad_clip_norm = 1.0

  c.warmstart.enabled = True
  c.warmstart.learning_rate = 3e-3
  c.warmstart.batch_size = 128
  c.warmstart.eval_every = 10
  c.warmstart.target_accuracy = 0.3
  c.warmstart.max_steps = 2000

  c.eval.every = 25
  c.eval.size = 256
  c.checkpoint.every = 100
  c.log.samples_every = 50

  if preset == "test":
    # Tiny shapes for the test suite: a few steps, every code path (warm start, eval, checkpoints).
    c.num_steps = 4
    c.model.hidden_size = 16
    c.model.intermediate_size = 32
    c.model.num_layers = 1
    c.model.num_heads = 2
    c.model.num_kv_heads = 2
    c.model.head_dim = 8
    c.grpo.group_size = 4
    c.grpo.prompts_per_step = 4
    c.warmstart.batch_size = 16
    c.warmstart.max_steps = 2
    c.warmstart.eval_every = 1
    c.warmstart.target_accuracy = 1.0
    c.eval.every = 2
    c.eval.size = 16
    c.eval.batch_size = 16
    c.checkpoint.every = 2
    c.log.samples_every = 2
    c.log.progress_bar = False
  elif preset not in (None, ""):
    raise ValueError(f"experiments/default.py: unknown preset {preset!r} (known: test)")
  return c
