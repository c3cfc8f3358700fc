# hf download Qwen/Qwen3-30B-A3B --local-dir models/Qwen3-30B-A3B   # once, where the hub is reachable (61 GB)
# python scripts/train.py --config experiments/qwen3_moe_gsm8k.py --workdir runs/qwen3_moe_gsm8k
#   (one node of 8 GPUs of 80 GB; preset experiments/qwen3_moe_gsm8k.py:test for the CI run on the tiny random
#    Qwen3-MoE fixture)
"""GRPO on GSM8K with Qwen3-30B-A3B (a mixture of experts: 48 layers of 128 experts, 8 per token; 30.5B
parameters, 3.35B active), on one node of 8 GPUs, with GSPO's sequence-level ratio and rollout routing replay.

Model: models/Qwen3-30B-A3B (not shipped; the command above; another directory: --config.model.hf_path=DIR).
Data: the vendored GSM8K (data/gsm8k, train.jsonl for training, test.jsonl held out). Prompt, rewards and held-out
accuracy as experiments/gsm8k.py: the tokenizer's chat template with a system prompt asking for <think> ...
</think> <answer> ... </answer> (Qwen3 thinks in <think> tags natively), gsm8k_accuracy 1.0 + format_strict 0.1.

The MoE trap and the answers to it. The sampler and the update can route the same token to different experts
(bf16 rounding, another batch layout); a flipped choice moves a token's log-prob far more than rounding does, so
token-level importance ratios and the sampler/trainer log-prob mismatch blow up. Two published answers, both on:
- moe.routing_replay=True: rollout routing replay. The sampler records the experts it chose for every token; the
  update's forward (and the old policy's) uses those experts, and the router still learns through the weights it
  gives them. moe/routing_flip logs the share of choices the update's router would have made differently.
- GSPO (Zheng et al. 2025, arXiv:2507.18071, the Qwen team's, shown on Qwen3-30B-A3B): one length-normalized
  ratio per completion (grpo.importance_level "sequence") clipped at 1 - 3e-4 / 1 + 4e-4, the paper's ranges, and
  4 mini-batches per rollout batch, as in the paper (the ratio moves off 1 after the first); no KL term (beta 0,
  as the paper; a float32 reference copy would add 14.2 GiB per device: 73.9 in all, which does not fit).
moe.impl "auto" (ragged_dot on GPUs, dropless); no load-balancing or z-loss (the pretrained router is kept; the
update logs moe/expert_load).

Memory, on 8 x H100 80GB (grpo_jax.commands.memory_estimate; an estimate, not a measurement):
- float32 master weights with bf16 compute, as experiments/gsm8k.py: AdamW steps of ~1e-6 are below bf16's
  resolution of weights of ~1e-2, so bfloat16 parameters would not move. 16 bytes per parameter is 56.9 GiB per
  device of the 8 for parameters, gradients and moments, which leaves the rollout little: 8 prompts x G = 16 =
  128 completions per step (not gsm8k.py's 256: the KV cache of 256 rows of 256 + 1024 tokens would not fit).
- mesh fsdp = 8: every parameter split 8 ways along the model width, the experts' too. The expert axis
  (mesh.expert = 8 divides the 128 experts) splits only the expert weights and leaves the 1.5B others
  (attention, the untied 151,936-token embeddings) and their AdamW state replicated: 79.8 GiB per device against
  59.7 (`--mesh 1,1,1,8`).
- remat on, micro-batches of 8 rows (one per GPU, 4 per mini-batch of 32). The planner's answer for this step:
    python -m grpo_jax.commands.memory_estimate --model qwen3-30b-a3b --param-dtype float32 --plan --devices 8 \\
        --sampler-batch 128 --prompt-len 256 --new-tokens 1024 --no-ref
    -> fits: mesh data,fsdp,tensor,expert = (1, 8, 1, 1), micro-batch 8, remat on, 59.7 GiB per device (of 60.5
       usable)
  Tight. bfloat16 parameters would fit 256 completions in micro-batches of 64 at 39.0 GiB (--param-dtype bfloat16
  --mesh 1,8,1 --sampler-batch 256 --micro-batch 64 --prompt-repeats 16), but not learn at lr 1e-6 (above).
500 steps: 4,000 training problems, about half an epoch; lr 1e-6 constant after 10 warmup steps, clipping at 1.
"""
import os

from grpo_jax import config as base
from grpo_jax.data.templates import R1_SYSTEM_PROMPT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 0
  c.num_steps = 500

  c.model.hf_path = os.path.join(ROOT, "models", "Qwen3-30B-A3B")
  c.model.param_dtype = "float32"
  c.model.dtype = "bfloat16"
  c.model.remat = True
  c.model.logprob_chunk_size = 128
  c.mesh.fsdp = 8

  c.moe.impl = "auto"
  c.moe.routing_replay = True

  c.task.name = "dataset"
  c.task.train_path = os.path.join(ROOT, "data", "gsm8k", "train.jsonl")
  c.task.heldout_path = os.path.join(ROOT, "data", "gsm8k", "test.jsonl")
  c.task.template = "chat"
  c.task.system_prompt = R1_SYSTEM_PROMPT

  c.rewards = {"gsm8k_accuracy": 1.0, "format_strict": 0.1}
  c.eval.accuracy_reward = "gsm8k_accuracy"

  c.sampling.max_prompt_length = 256
  c.sampling.max_new_tokens = 1024
  c.sampling.temperature = 1.0

  c.grpo.group_size = 16
  c.grpo.prompts_per_step = 8
  c.grpo.num_iterations = 1
  c.grpo.mini_batch_size = 32     # 4 updates per rollout batch (GSPO's)
  c.grpo.micro_batch_size = 8     # one row per GPU per forward/backward
  c.grpo.importance_level = "sequence"
  c.grpo.epsilon_low = 3e-4
  c.grpo.epsilon_high = 4e-4
  c.grpo.beta = 0.0
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

  if preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, "gsm8k", checkpoint="qwen3_moe_checkpoint")
    c.grpo.mini_batch_size = 4    # 2 mini-batches of 2 micro-batches: the full run's structure
    c.grpo.micro_batch_size = 2
    c.mesh.fsdp = 1               # one CPU device
  elif preset not in (None, ""):
    raise ValueError(f"experiments/qwen3_moe_gsm8k.py: unknown preset {preset!r} (known: test)")
  return c
