# hf download google/gemma-3-1b-it --local-dir models/gemma-3-1b-it   # once, where the hub is reachable
# python scripts/train.py --config experiments/gemma3_gsm8k.py --workdir runs/gemma3_gsm8k
#   (preset experiments/gemma3_gsm8k.py:test for the CI run on the tiny random Gemma 3 fixture)
"""Gemma 3 1B-it on GSM8K with LoRA, at the settings of Google Tunix's GRPO demo (issue 31, item 7).

Source: google/tunix, examples/grpo_gemma.ipynb at commit e7298ece8151abcc76f54738813e2590e4bde111 (2026-08-03;
https://github.com/google/tunix/blob/e7298ece8151abcc76f54738813e2590e4bde111/examples/grpo_gemma.ipynb), the
"GRPO Demo" that trains google/gemma-3-1b-it on GSM8K on one TPU v6e. Its CLI twin,
examples/rl/grpo/gsm8k/configs/gemma3_1b.yaml, has the same LoRA, GRPO, sampling and optimizer numbers (and
trains on all 3738 batches: 3738 steps).

Model: models/gemma-3-1b-it (not shipped; the command above). Data: the vendored GSM8K (data/gsm8k, MIT):
training problems from train.jsonl, held-out accuracy on test.jsonl.

Prompt: Gemma 3's chat template with the demo's instruction as the system message, which that template puts in
front of the question in the user turn; the text is the demo's prompt exactly, "<bos>" included:

    <bos><start_of_turn>user
    You are given a problem. First, think about ... between <answer> and </answer>.

    {question}<end_of_turn>
    <start_of_turn>model

Completions stop at <end_of_turn> or <eos> (the demo's eos ids 1 and 106).

Rewards, summed as in the demo (grpo_jax/rewards/reasoning_tags.py; its weights are the demo's points):
reasoning_format 3.0 + reasoning_format_tags 1.0 (-2.5..2.5) + reasoning_answer_graded 1.0 (-1..3) +
reasoning_answer_number 1.5. Held-out accuracy: reasoning_answer_number of greedy completions (the demo's own
accuracy rule), on 64 test problems as in the demo.

Settings, the demo's -> ours:
  LoRA rank 64, alpha 64.0 on q_einsum, kv_einsum,     -> model.lora_rank 64, lora_alpha 64.0, lora_targets "all"
    attn_vec_einsum, gate/up/down_proj                    (the same projections; see below for k and v)
  reference model: the base                            -> the base with the adapters off (LoRA)
  fp32 training ("We perform full precision (fp32)")   -> model.param_dtype and model.dtype float32, no remat
  NUM_GENERATIONS 2; batch, mini- and micro-batch 1     -> grpo.group_size 2, prompts_per_step 1; one update of
    prompt                                                 2 rows per step (mini_ and micro_batch_size 0)
  NUM_ITERATIONS 1, BETA 0.08, EPSILON 0.2             -> grpo.num_iterations 1, beta 0.08, epsilon_low 0.2
  KL penalty: Tunix's default (see below)              -> grpo.kl_estimator k3
  sequence-mean-token-mean; (r - mean) / (std + eps),  -> grpo.aggregation seq_mean_token_mean, advantage grpo,
    std with ddof 1                                        std_ddof 1
  MAX_PROMPT_LENGTH 256, TOTAL_GENERATION_STEPS 768    -> sampling.max_prompt_length 256, max_new_tokens 768
  TEMPERATURE 0.9, TOP_P 1.0, TOP_K 50                 -> sampling.temperature 0.9, top_p 1.0, top_k 50
  AdamW lr 3e-6, b1 0.9, b2 0.99, weight decay 0.1     -> optim.learning_rate 3e-6, b1 0.9, b2 0.99, weight_decay 0.1
  warmup_cosine_decay_schedule 0 -> 3e-6 over 10% of   -> optim.schedule cosine, warmup_steps 336, min_lr_ratio 0
    the steps, then down to 0
  clip_by_global_norm 0.1                              -> optim.grad_clip_norm 0.1
  MAX_STEPS = 3738 batches x TRAIN_FRACTION 0.9 = 3364 -> num_steps 3364
  greedy accuracy on 64 test problems                  -> eval.size 64 (greedy), every 64 steps (EVAL_EVERY_N_STEPS)
  checkpoints every 500 steps, 4 kept                  -> checkpoint.every 500, keep 4
  data shuffle seed 42                                 -> seed 42

What differs, and the nearest choice:
- KL estimator: the notebook sets none. Tunix's default was low_var_kl (k3) when the Gemma 3 notebook was
  published (2025-11) and is plain "kl" (k1, log pi - log pi_ref) since its 2026-05 refactor (6d755580); k3 here.
- Data: the demo takes the first 3738 problems of GSM8K's shuffled train split (half of it) and holds 10% of
  them out as a validation set whose rewards it logs every 64 steps. The 3364 steps here also see 3364 distinct
  problems, drawn from the whole train split; no validation set, the held-out accuracy on test problems instead.
- LoRA on k and v: Tunix's Gemma computes them in one projection (kv_einsum), so one adapter (one A) serves
  both; here k_proj and v_proj have an adapter each.
- Long prompts: Tunix's sampler widens its prompt buffer (to the next power of 2) for a prompt over 256 tokens;
  here such a prompt is dropped and counted in the log.
- The demo's advantage eps is 1e-6 at this commit (1e-4 earlier); ours is 1e-4 (it matters only for near-equal
  rewards).

Memory (scripts/memory_estimate.py; an estimate, not a measurement): 14.8 GiB per device on one 80 GB GPU
(float32, LoRA r64 on all 7 projections: 52M trainable parameters; no remat, as Tunix's default):
  python scripts/memory_estimate.py --model gemma3-1b --param-dtype float32 --dtype float32 --sampler-batch 2 \\
      --prompt-len 256 --new-tokens 768 --micro-batch 2 --prompt-repeats 2 --lora-rank 64
XLA's own count for the compiled update, on the CPU: 20.0 GiB (`python benchmarks/memory_fit.py --recipe
experiments/gemma3_gsm8k.py --model gemma3-1b`, random weights of the 1B shape; 358 s to compile on 2 cores).
"""
import os

from grpo_jax import config as base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_PROMPT = ("You are given a problem. First, think about the problem and provide your reasoning. Place it "
                 "between <reasoning> and </reasoning>. Then, provide the final answer (i.e., just one numerical "
                 "value) between <answer> and </answer>.")   # the demo's SYSTEM_PROMPT, word for word


def get_config(preset: str | None = None):
  c = base.get_config()
  c.seed = 42
  c.num_steps = 3364

  c.model.hf_path = os.path.join(ROOT, "models", "gemma-3-1b-it")
  c.model.param_dtype = "float32"
  c.model.dtype = "float32"
  c.model.remat = False
  c.model.logprob_chunk_size = 128
  c.model.lora_rank = 64
  c.model.lora_alpha = 64.0
  c.model.lora_targets = "all"

  c.task.name = "dataset"
  c.task.train_path = os.path.join(ROOT, "data", "gsm8k", "train.jsonl")
  c.task.heldout_path = os.path.join(ROOT, "data", "gsm8k", "test.jsonl")
  c.task.template = "chat"
  c.task.system_prompt = SYSTEM_PROMPT

  c.rewards = {"reasoning_format": 3.0, "reasoning_format_tags": 1.0, "reasoning_answer_graded": 1.0,
               "reasoning_answer_number": 1.5}
  c.eval.accuracy_reward = "reasoning_answer_number"

  c.sampling.max_prompt_length = 256
  c.sampling.max_new_tokens = 768
  c.sampling.temperature = 0.9
  c.sampling.top_p = 1.0
  c.sampling.top_k = 50

  c.grpo.group_size = 2
  c.grpo.prompts_per_step = 1
  c.grpo.num_iterations = 1
  c.grpo.mini_batch_size = 0      # one update per rollout batch ...
  c.grpo.micro_batch_size = 0     # ... in one forward/backward (2 rows)
  c.grpo.beta = 0.08
  c.grpo.kl_estimator = "k3"
  c.grpo.epsilon_low = 0.2
  c.grpo.advantage = "grpo"
  c.grpo.std_ddof = 1
  c.grpo.aggregation = "seq_mean_token_mean"

  c.optim.learning_rate = 3e-6
  c.optim.schedule = "cosine"
  c.optim.warmup_steps = 336      # 10% of num_steps
  c.optim.min_lr_ratio = 0.0
  c.optim.b1 = 0.9
  c.optim.b2 = 0.99
  c.optim.weight_decay = 0.1
  c.optim.grad_clip_norm = 0.1

  c.eval.every = 64
  c.eval.size = 64
  c.eval.batch_size = 64
  c.checkpoint.every = 500
  c.checkpoint.keep = 4
  c.log.samples_every = 50

  if preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, "gsm8k", checkpoint="gemma3_checkpoint")
    c.grpo.micro_batch_size = 0   # one forward/backward per update, as in the full run
  elif preset not in (None, ""):
    raise ValueError(f"experiments/gemma3_gsm8k.py: unknown preset {preset!r} (known: test)")
  return c
