"""Tiny random transformers checkpoints (the reference), loaded here with `from_pretrained`."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from grpo_jax.model import Transformer
from grpo_jax.model.hf_io import from_pretrained


def tiny_hf_model(kind: str, seed: int = 0):
  """A random Qwen2 (GQA, q/k/v bias, untied), Llama (tied, llama3 rope scaling) or Qwen3 (q/k norm, head_dim
  != hidden / heads) with spread-out logits."""
  common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6, initializer_range=0.2)
  if kind == "qwen2":
    hf_cfg = transformers.Qwen2Config(**common, tie_word_embeddings=False)
  elif kind == "llama":
    hf_cfg = transformers.LlamaConfig(
        **common, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64))
  elif kind == "qwen3":
    hf_cfg = transformers.Qwen3Config(**common, head_dim=24, tie_word_embeddings=False)
  else:
    raise ValueError(kind)
  torch.manual_seed(seed)
  hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
  # Random biases and norm scales too (initialized to 0 and 1), so a missing or misplaced one would show.
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if name.endswith("bias") or name.endswith("norm.weight"):
        p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.2)
  return hf


def jax_twin(hf, directory) -> Transformer:
  """The same weights in our Transformer, through a safetensors checkpoint and `from_pretrained`."""
  hf.save_pretrained(directory)
  return from_pretrained(directory)


@pytest.fixture(scope="session")
def qwen2_pair(tmp_path_factory):
  hf = tiny_hf_model("qwen2")
  return hf, jax_twin(hf, tmp_path_factory.mktemp("qwen2"))


def teacher_forced_logits(model: Transformer, res) -> np.ndarray:
  """float64 [B, N, V]: the logits from which each completion token of `res` (a SampleResult) was drawn,
  recomputed by one full forward pass without a cache (an independent path from the sampler's decode)."""
  from grpo_jax.model import causal_attention_mask, positions_from_mask
  tokens = np.concatenate([res.prompt_BxP, res.completion_BxC], axis=1)
  fwd_mask = np.concatenate([res.prompt_mask_BxP, np.ones_like(res.completion_mask_BxC)], axis=1).astype(bool)
  hidden, _ = model(tokens, positions_from_mask(fwd_mask), causal_attention_mask(fwd_mask))
  P, N = res.prompt_BxP.shape[1], res.completion_BxC.shape[1]
  return np.asarray(model.logits(hidden[:, P - 1:P - 1 + N]), np.float64)


def random_prompts(rng: np.random.Generator, lengths, vocab_size: int, low: int = 3):
  return [rng.integers(low, vocab_size, n).tolist() for n in lengths]
