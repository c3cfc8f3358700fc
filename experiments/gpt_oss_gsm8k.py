# hf download openai/gpt-oss-20b --local-dir models/gpt-oss-20b-mxfp4   # once, where the hub is reachable
# python -c "import torch, transformers as t; s, d = 'models/gpt-oss-20b-mxfp4', 'models/gpt-oss-20b'; \
#   t.AutoModelForCausalLM.from_pretrained(s, quantization_config=t.Mxfp4Config(dequantize=True), \
#   dtype=torch.bfloat16).save_pretrained(d); t.AutoTokenizer.from_pretrained(s).save_pretrained(d)"
# python scripts/train.py --config experiments/gpt_oss_gsm8k.py --workdir runs/gpt_oss_gsm8k
#   (one node of 8 GPUs of 80 GB; preset experiments/gpt_oss_gsm8k.py:test for the CI run on the tiny random
#    gpt-oss fixture)
"""GRPO on GSM8K with gpt-oss-20b (a mixture of experts: 24 layers of 32 experts, 4 per token; 20.9B parameters,
4.19B active; sliding-window and full layers alternating, attention sinks), on one node of 8 GPUs, with GSPO's
sequence-level ratio and rollout routing replay.

Model: models/gpt-oss-20b, a dequantized bfloat16 copy (the commands above; 42 GB). The Hub checkpoint stores its
experts in MXFP4 (quantization_config.quant_method "mxfp4"), which grpo_jax does not read: it refuses the
checkpoint with that message. transformers dequantizes it once (Mxfp4Config(dequantize=True): no GPU, no
kernels; torch and ~45 GB of host memory) and save_pretrained writes plain bfloat16 gate_up_proj / down_proj
tensors with no quantization_config, which grpo_jax loads (into float32 master weights, below).
Data: the vendored GSM8K (data/gsm8k, train.jsonl for training, test.jsonl held out).

Prompt: the tokenizer's chat template (gpt-oss's harmony format: the system message becomes the developer
instructions; the model reasons in its analysis channel, then answers in the final one, default reasoning effort
"medium"), so no <think> tags are asked for, only the answer in tags. Completions stop at <|return|> (the
tokenizer's eos) or <|endoftext|>. Rewards: gsm8k_accuracy 1.0 (the number in the last <answer> pair, else after
####, else \\boxed{}, else the last number) + answer_tag 0.1 (a non-blank <answer> pair). Held-out accuracy =
gsm8k_accuracy of greedy completions.

MoE stability, as experiments/qwen3_moe_gsm8k.py: moe.routing_replay=True (rollout routing replay: the update's
log-probs, and the old policy's, use the experts the sampler chose for each token, so a routing flip between the
sampler's forward and the update's cannot move the ratio; moe/routing_flip logs how often it would have) and GSPO
(arXiv:2507.18071: grpo.importance_level "sequence", clipping at 1 - 3e-4 / 1 + 4e-4, 4 mini-batches per rollout
batch, no KL term). moe.impl "auto" (ragged_dot on GPUs, dropless); no load-balancing or z-loss.

Memory, on 8 x H100 80GB (grpo_jax.commands.memory_estimate; an estimate, not a measurement): float32 master
weights with bf16 compute (AdamW steps of ~1e-6 vanish in bfloat16 weights), fsdp = 8 (every parameter split 8
ways; the expert axis, 8 of the 32 experts each, would leave the 1.8B others, the 201,088-token untied embeddings
among them, replicated with their AdamW state: 72.4 GiB per device against 49.0, `--mesh 1,1,1,8`), remat on.
The planner's answer for this step (16 prompts x G = 16 completions of 384 + 1024 tokens, beta 0):
    python -m grpo_jax.commands.memory_estimate --model gpt-oss-20b --param-dtype float32 --plan --devices 8 \\
        --sampler-batch 256 --prompt-len 384 --new-tokens 1024 --no-ref
    -> fits: mesh data,fsdp,tensor,expert = (1, 8, 1, 1), micro-batch 128, remat on, 57.5 GiB per device (of 60.5
       usable)
GSPO's 4 mini-batches of 64 cap the micro-batch at 64 (one forward/backward per update, 8 rows per GPU): 49.0 GiB
(--mesh 1,8,1 --micro-batch 64 --prompt-repeats 16). 500 steps: 8,000 problems, about one epoch; lr 1e-6 constant
after 10 warmup steps, clipping at 1.
"""
import os

from grpo_jax import config as base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_PROMPT = ("Solve the grade-school math problem. End your final answer with the number alone in <answer> "
                 "</answer> tags, e.g. <answer>42</answer>.")


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 0
  c.num_steps = 500

  c.model.hf_path = os.path.join(ROOT, "models", "gpt-oss-20b")   # the dequantized copy (see the docstring)
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
  c.task.system_prompt = SYSTEM_PROMPT

  c.rewards = {"gsm8k_accuracy": 1.0, "answer_tag": 0.1}
  c.eval.accuracy_reward = "gsm8k_accuracy"

  c.sampling.max_prompt_length = 384   # harmony's system and developer messages come before the question
  c.sampling.max_new_tokens = 1024
  c.sampling.temperature = 1.0

  c.grpo.group_size = 16
  c.grpo.prompts_per_step = 16
  c.grpo.num_iterations = 1
  c.grpo.mini_batch_size = 64     # 4 updates per rollout batch (GSPO's) ...
  c.grpo.micro_batch_size = 0     # ... each in one forward/backward
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
    testing.apply_test_preset(c, "gsm8k", checkpoint="gpt_oss_checkpoint")
    c.grpo.mini_batch_size = 4    # 2 mini-batches, each in one forward/backward: the full run's structure
    c.grpo.micro_batch_size = 0
    c.mesh.fsdp = 1               # one CPU device
  elif preset not in (None, ""):
    raise ValueError(f"experiments/gpt_oss_gsm8k.py: unknown preset {preset!r} (known: test)")
  return c
