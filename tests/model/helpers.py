"""Tiny random Hugging Face checkpoints (built with transformers + torch) that the JAX model must reproduce,
and the forward passes on both sides."""
from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

VOCAB = 96

# name -> (config class name, config kwargs, save kwargs). Together they cover GQA, q/k/v bias, q/k norm, a
# head_dim that is not hidden/heads, llama3 rope scaling, tied and untied embeddings, and a sharded checkpoint.
SPECS = {
    "qwen2_gqa_bias_tied": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2,
                                                tie_word_embeddings=True, rope_theta=1000.0), {}),
    "qwen3_qknorm_untied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                                tie_word_embeddings=False), {}),
    "llama3_rope_sharded": ("LlamaConfig", dict(
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16)),
        dict(max_shard_size="20KB")),
}


def build_torch_model(name: str, seed: int = 0):
  import torch
  import transformers
  cls_name, kw, _ = SPECS[name]
  config = getattr(transformers, cls_name)(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                           num_hidden_layers=2, rms_norm_eps=1e-5,
                                           attn_implementation="eager", **kw)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  with torch.no_grad():  # every tensor random (norm scales around 1, non-zero biases) so each one matters.
    for pname, p in model.named_parameters():
      if p.ndim == 1 and "bias" not in pname:
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


def left_padded_batch(rng: np.random.Generator, lengths, total: int):
  """Random tokens [B, total] with lengths[b] real tokens at the right end of row b; padding id 0."""
  tokens = rng.integers(1, VOCAB, size=(len(lengths), total)).astype(np.int32)
  mask = np.zeros((len(lengths), total), bool)
  for b, n in enumerate(lengths):
    mask[b, total - n:] = True
  return np.where(mask, tokens, 0), mask


def torch_logits(model, tokens, mask) -> np.ndarray:
  """float64 logits of a transformers model with an attention mask and position ids skipping left padding."""
  import torch
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.double().numpy()


def jax_logits(model, tokens, mask) -> np.ndarray:
  from grpo_jax.model import causal_attention_mask, positions_from_mask
  hidden, _ = model(tokens, positions_from_mask(mask), causal_attention_mask(mask))
  return np.asarray(model.logits(hidden), np.float64)


def saved_on_first_use(tmp_path_factory, build):
  """A module fixture's getter: name -> (directory, torch model build(name)), saved with save_pretrained the first
  time the name is asked for."""
  built = {}

  def get(name):
    if name not in built:
      model = build(name)
      path = tmp_path_factory.mktemp(name)
      model.save_pretrained(path)
      built[name] = (path, model)
    return built[name]
  return get



@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens, mask):
  from grpo_jax.model import causal_attention_mask, positions_from_mask
  m = nnx.merge(graphdef, state)
  return m.logits(m(tokens, positions_from_mask(mask), causal_attention_mask(mask))[0])


def jitted_logits(model, tokens, mask) -> np.ndarray:
  """`jax_logits` through one jitted program per model structure and batch shape (run eagerly, each op of a
  multi-layer model is dispatched on its own)."""
  return np.asarray(_logits(*nnx.split(model), tokens, mask), np.float64)
