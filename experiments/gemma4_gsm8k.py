# hf download google/gemma-4-E2B-it --local-dir models/gemma-4-E2B-it   # once, where the hub is reachable
# python scripts/train.py --config experiments/gemma4_gsm8k.py --workdir runs/gemma4_gsm8k
#   (one 80 GB GPU; preset experiments/gemma4_gsm8k.py:test for the CI run on the tiny random Gemma 4 fixture)
"""GRPO on GSM8K with Gemma 4 E2B-it through LoRA adapters, on one 80 GB GPU.

Model: models/gemma-4-E2B-it (not shipped; the command above; another directory: --config.model.hf_path=DIR). The
published checkpoint is multimodal (Gemma4ForConditionalGeneration): its language model is loaded and trained,
the vision and audio towers are skipped (grpo_jax/model/hf_io.py). 35 layers: four sliding (window 512) then one
global with heads of 512; the last 20 layers read the keys and values of layers 13 and 14 (no cache of their
own) and have double-wide MLPs; per-layer input embeddings (a 262144 x 35 x 256 table, half of the 4.63B
parameters) (docs/models.md, "Gemma 4").

The rest is experiments/gsm8k.py's recipe (its prompt through the checkpoint's own chat template, rewards,
held-out accuracy, beta 0.04 with k3, G 16 x 16 prompts, float32 master weights with bf16 compute, remat), with
the vendored GSM8K files, and these changes:
- LoRA rank 64, alpha 64 on all seven projections of every layer (experiments/gemma3_gsm8k.py's, from Tunix's
  Gemma GRPO demo), lr 3e-6 (that demo's): full fine-tuning of the 4.63B parameters in float32 with AdamW and a
  reference copy is 89 GiB on one H100 even at one row per micro-batch (memory_estimate --plan: does not fit);
  with LoRA the reference is the base model, adapters off, and only the 97M adapter parameters take AdamW state.
- 4 micro-batches of 64 rows instead of 16 of 16: what the planner fits on one H100 80GB (an estimate, not a
  measurement):
  python -m grpo_jax.commands.memory_estimate --model gemma4-e2b --plan --devices 1 --sampler-batch 256 \\
      --prompt-len 256 --new-tokens 512 --lora-rank 64
  -> fits: mesh (1, 1, 1, 1), micro-batch 64, remat on, 48.3 GiB per device (of 60.5 usable)
"""
import os

from grpo_jax.sweep import spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config(preset: str | None = None):
  c = spec.sibling_experiment(__file__, "gsm8k.py").get_config()
  c.model.hf_path = os.path.join(ROOT, "models", "gemma-4-E2B-it")
  c.model.lora_rank = 64
  c.model.lora_alpha = 64.0
  c.model.lora_targets = "all"
  c.optim.learning_rate = 3e-6
  c.task.train_path = os.path.join(ROOT, "data", "gsm8k", "train.jsonl")
  c.task.heldout_path = os.path.join(ROOT, "data", "gsm8k", "test.jsonl")
  c.grpo.micro_batch_size = 64
  if preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, "gsm8k", checkpoint="gemma4_checkpoint")
  elif preset not in (None, ""):
    raise ValueError(f"experiments/gemma4_gsm8k.py: unknown preset {preset!r} (known: test)")
  return c
