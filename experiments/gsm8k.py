# python scripts/train.py --config experiments/gsm8k.py --workdir runs/gsm8k \
#     --config.model.hf_path=$HOME/models/Qwen2.5-0.5B-Instruct \
#     --config.task.train_path=data/gsm8k/train.jsonl --config.task.heldout_path=data/gsm8k/test.jsonl
#   (presets: experiments/gsm8k.py:1.5b for Qwen2.5-1.5B-Instruct; experiments/gsm8k.py:smollm2 for
#    SmolLM2-135M-Instruct on the vendored data/gsm8k on a CPU; experiments/gsm8k.py:test for the CI run)
# Tiny test preset (random checkpoint + fixture data, built on first use under $GRPO_JAX_FIXTURES or
# /tmp/grpo_jax_fixtures): python scripts/train.py --config experiments/gsm8k.py:test --workdir /tmp/gsm8k_test
"""GRPO on GSM8K with an instruct model (Qwen2.5-0.5B-Instruct; 1.5B preset).

Inputs are local (nothing is downloaded by the code). GSM8K is vendored (data/gsm8k/train.jsonl and test.jsonl,
the paper's 7,473 and 1,319 problems); the model is fetched once where the hub is reachable (`hf`, the command
of the huggingface_hub that transformers installs):
  hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir $HOME/models/Qwen2.5-0.5B-Instruct
and `model.hf_path` (checkpoint and tokenizer) points at it. Any GSM8K-layout file (question, answer with
"#### <number>") in JSONL, Parquet or save_to_disk form works, e.g. the hub's Parquet copy, kept out of the
vendored directory: hf download openai/gsm8k --repo-type dataset --local-dir $HOME/data/gsm8k (then
task.train_path=$HOME/data/gsm8k/main/train-00000-of-00001.parquet, and test-... for task.heldout_path).

Prompts: the tokenizer's chat template with a system prompt asking for <think> … </think> <answer> … </answer>.
Rewards, weighted (not gated): gsm8k_accuracy 1.0 (the number in <answer>, else after ####, else \\boxed{},
else the last number, compared exactly with the gold number) + format_strict 0.1 (the whole completion is
one think block then one answer block). Held-out accuracy = gsm8k_accuracy of greedy completions.
Hyperparameters after DeepSeekMath / TRL (docs/algorithms.md §7): lr 1e-6 constant, beta 0.04 (k3), G 16 x 16
prompts = 256 completions per step, one update per step, T 1.0, 512 new tokens; bf16 compute with float32
master weights (a 1e-6 update is below bf16 resolution); 500 steps ~ one epoch of the 7.5k training problems.
"""
import os

from grpo_jax import config as base
from grpo_jax.data.templates import R1_SYSTEM_PROMPT


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 0
  c.num_steps = 500

  c.model.hf_path = ""            # required: a local Qwen2.5-0.5B-Instruct directory (see the docstring).
  c.model.param_dtype = "float32"
  c.model.dtype = "bfloat16"
  c.model.remat = True
  c.model.logprob_chunk_size = 128

  c.task.name = "dataset"
  c.task.train_path = ""          # required: GSM8K train split (JSONL / Parquet / save_to_disk).
  c.task.heldout_path = ""        # GSM8K test split; "": hold out task.heldout_fraction of the train rows.
  c.task.heldout_fraction = 0.05
  c.task.template = "chat"
  c.task.system_prompt = R1_SYSTEM_PROMPT

  c.rewards = {"gsm8k_accuracy": 1.0, "format_strict": 0.1}
  c.eval.accuracy_reward = "gsm8k_accuracy"

  c.sampling.max_prompt_length = 256
  c.sampling.max_new_tokens = 512
  c.sampling.temperature = 1.0

  c.grpo.group_size = 16
  c.grpo.prompts_per_step = 16
  c.grpo.num_iterations = 1
  c.grpo.mini_batch_size = 0      # one update per rollout batch
  c.grpo.micro_batch_size = 16    # gradient accumulation over 16 micro-batches (memory)
  c.grpo.beta = 0.04
  c.grpo.kl_estimator = "k3"
  c.grpo.aggregation = "seq_mean_token_mean"

  c.optim.learning_rate = 1e-6
  c.optim.schedule = "constant"
  c.optim.warmup_steps = 10
  c.optim.grad_clip_norm = 1.0

  c.eval.every = 25
  c.eval.size = 512
  c.eval.batch_size = 128
  c.checkpoint.every = 50
  c.log.samples_every = 10

  if preset == "smollm2":
    # SmolLM2-135M-Instruct (bash scripts/get_smollm2.sh) on the vendored GSM8K files, at sizes a 2-core CPU
    # runs (minutes per step); the recipe's structure is unchanged (remat, bf16 compute, beta > 0 with the
    # reference, micro-batches).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    c.model.hf_path = os.path.join(root, "models", "SmolLM2-135M-Instruct")
    c.task.train_path = os.path.join(root, "data", "gsm8k", "train.jsonl")
    c.task.heldout_path = os.path.join(root, "data", "gsm8k", "test.jsonl")
    c.num_steps = 40
    c.sampling.max_new_tokens = 256
    c.grpo.group_size = 8
    c.grpo.prompts_per_step = 4
    c.grpo.micro_batch_size = 8
    c.optim.learning_rate = 1e-5
    c.optim.warmup_steps = 0
    c.eval.every = 10
    c.eval.size = 200
    c.eval.batch_size = 200
    c.checkpoint.every = 5
    c.log.samples_every = 5
  elif preset == "1.5b":
    # Qwen2.5-1.5B-Instruct: the same recipe with smaller micro-batches.
    c.grpo.micro_batch_size = 8
  elif preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, "gsm8k")
  elif preset not in (None, ""):
    raise ValueError(f"experiments/gsm8k.py: unknown preset {preset!r} (known: 1.5b, smollm2, test)")
  return c

