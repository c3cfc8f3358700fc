# python scripts/train.py --config experiments/countdown.py --workdir runs/countdown \
#     --config.model.hf_path=$HOME/models/Qwen2.5-3B \
#     --config.task.train_path=$HOME/data/countdown/data/train-00000-of-00001.parquet
#   (presets: experiments/countdown.py:0.5b for Qwen2.5-0.5B; experiments/countdown.py:test for the CI run)
# Tiny test preset (random checkpoint + fixture data, built on first use under $GRPO_JAX_FIXTURES or
# /tmp/grpo_jax_fixtures): python scripts/train.py --config experiments/countdown.py:test --workdir /tmp/cd_test
"""TinyZero-style GRPO on Countdown with a base model (Qwen2.5-3B suggested; 0.5B preset).

Countdown: given numbers and a target, write an arithmetic expression (+ - * / and parentheses, each number
used at most once) equal to the target. Inputs are local; where the hub is reachable, fetch them once with `hf`
(huggingface_hub's command):
  hf download Qwen/Qwen2.5-3B --local-dir $HOME/models/Qwen2.5-3B
  hf download Jiayi-Pan/Countdown-Tasks-3to4 --repo-type dataset --local-dir $HOME/data/countdown
Any file with columns `nums` (or `numbers`) and `target` works (JSONL, Parquet, save_to_disk).

Prompts: the R1-Zero plain-text template (a base model has no chat template) ending in "<think>", so the
completion starts inside the reasoning block. Rewards: `countdown` GATED on `format_lenient_prefilled`
(the exact expression check counts only when a <think> block closes before a non-empty <answer> block),
weight 1.0, plus `format_strict_prefilled` 0.1 (nothing but one think and one answer block), which
rewards ending the answer cleanly. Held-out accuracy = the gated countdown reward of greedy completions.
Hyperparameters after TinyZero / R1-Zero (docs/algorithms.md §7): lr 1e-6, beta 0.001 (k3), G 8 x 32 prompts =
256 completions per step in 2 mini-batch updates, T 1.0, 1024 new tokens, bf16 compute with float32 master
weights, 300 steps.
"""
from grpo_jax import config as base


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 0
  c.num_steps = 300

  c.model.hf_path = ""            # required: a local Qwen2.5 base checkpoint directory (see the docstring).
  c.model.param_dtype = "float32"
  c.model.dtype = "bfloat16"
  c.model.remat = True
  c.model.logprob_chunk_size = 128
  # Qwen2.5-3B on one 80 GB GPU: float32 weights + AdamW take 34.5 GiB and the update 58.6 GiB at its peak
  # (XLA's analysis), so the reference (11.5 GiB) waits in host memory between its uses (benchmarks/memory_fit.py).
  c.model.offload_ref_params = True

  c.task.name = "dataset"
  c.task.train_path = ""          # required: Countdown rows (nums, target).
  c.task.heldout_path = ""        # "": hold out task.heldout_fraction of the train rows.
  c.task.heldout_fraction = 0.01  # ~3k of Countdown-Tasks-3to4's 490k rows.
  c.task.template = "r1_zero"
  c.task.prefill_think = True

  c.rewards = {"countdown": 1.0, "format_strict_prefilled": 0.1}
  c.reward_gates = {"countdown": "format_lenient_prefilled"}
  c.eval.accuracy_reward = "countdown"

  c.sampling.max_prompt_length = 256
  c.sampling.max_new_tokens = 1024
  c.sampling.temperature = 1.0

  c.grpo.group_size = 8
  c.grpo.prompts_per_step = 32
  c.grpo.num_iterations = 1
  c.grpo.mini_batch_size = 128    # 2 updates per rollout batch (the second slightly off-policy: clipped)
  c.grpo.micro_batch_size = 8
  c.grpo.beta = 0.001
  c.grpo.kl_estimator = "k3"
  c.grpo.aggregation = "seq_mean_token_mean"

  c.optim.learning_rate = 1e-6
  c.optim.schedule = "constant"
  c.optim.warmup_steps = 0
  c.optim.grad_clip_norm = 1.0

  c.eval.every = 25
  c.eval.size = 512
  c.eval.batch_size = 128
  c.checkpoint.every = 50
  c.log.samples_every = 10

  if preset == "0.5b":
    # Qwen2.5-0.5B: fits smaller accelerators; TinyZero reports that models this small rarely learn to search.
    c.grpo.micro_batch_size = 32
  elif preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, "countdown")
    c.grpo.mini_batch_size = 4    # two updates per rollout, as in the recipe (the second off-policy) ...
    c.grpo.micro_batch_size = 2   # ... each accumulated over micro-batches, as in the recipe
  elif preset not in (None, ""):
    raise ValueError(f"experiments/countdown.py: unknown preset {preset!r} (known: 0.5b, test)")
  return c

