# hf download Qwen/Qwen3.5-0.8B --local-dir models/Qwen3.5-0.8B   # once, where the hub is reachable
# python scripts/train.py --config experiments/qwen3_5_gsm8k.py --workdir runs/qwen3_5_gsm8k
#   (one 80 GB GPU; preset experiments/qwen3_5_gsm8k.py:test for the CI run on the tiny random Qwen3.5 fixture)
"""GRPO on GSM8K with Qwen3.5-0.8B, a hybrid of linear and full attention, on one 80 GB GPU.

Model: models/Qwen3.5-0.8B (not shipped; the command above; another directory: --config.model.hf_path=DIR). The
published checkpoint is multimodal (Qwen3_5ForConditionalGeneration): its language model is loaded and trained,
the vision tower and the multi-token-prediction head are skipped (grpo_jax/model/hf_io.py). 24 layers: three of
every four Gated DeltaNet (a causal convolution and a recurrent state per row: the sampler's cache for them does
not grow with the completion), the fourth full attention with a gated output (docs/models.md, "Qwen3.5").

The rest is experiments/gsm8k.py's recipe (its prompt, rewards, held-out accuracy, lr 1e-6, beta 0.04 with k3,
G 16 x 16 prompts, float32 master weights with bf16 compute, remat), with the vendored GSM8K files, and 4
micro-batches of 64 rows instead of 16 of 16: what the planner fits on one H100 80GB (an estimate, not a
measurement):
  python -m grpo_jax.commands.memory_estimate --model qwen3.5-0.8b --plan --devices 1 --sampler-batch 256 \
      --prompt-len 256 --new-tokens 512
  -> fits: mesh (1, 1, 1, 1), micro-batch 64, remat on, 43.3 GiB per device (of 60.5 usable)
"""
import os

from grpo_jax.sweep import spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config(preset: str | None = None):
  c = spec.sibling_experiment(__file__, "gsm8k.py").get_config()
  c.model.hf_path = os.path.join(ROOT, "models", "Qwen3.5-0.8B")
  c.task.train_path = os.path.join(ROOT, "data", "gsm8k", "train.jsonl")
  c.task.heldout_path = os.path.join(ROOT, "data", "gsm8k", "test.jsonl")
  c.grpo.micro_batch_size = 64
  if preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, "gsm8k", checkpoint="qwen3_5_checkpoint")
  elif preset not in (None, ""):
    raise ValueError(f"experiments/qwen3_5_gsm8k.py: unknown preset {preset!r} (known: test)")
  return c
