"""Tiny random transformers checkpoints (the reference) and the same weights in our Transformer."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from grpo_jax.model import Transformer, from_hf_config


def hf_to_params(hf_model, model: Transformer) -> None:
  """Copies a transformers Llama/Qwen2 state dict into `model` (in place).

  A local stand-in for `grpo_jax.model.hf_io.from_pretrained`, written against the HF layout:
  Linear weights are [out, in], so projections transpose and split their out dimension into heads.
  """
  cfg = model.cfg
  sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf_model.state_dict().items()}
  D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  model.embed_VxD.value = sd["model.embed_tokens.weight"]
  for i, layer in enumerate(model.layers):
    p = f"model.layers.{i}."
    layer.input_norm.scale.value = sd[p + "input_layernorm.weight"]
    layer.post_attn_norm.scale.value = sd[p + "post_attention_layernorm.weight"]
    a = layer.attn
    a.q_DxNxH.value = sd[p + "self_attn.q_proj.weight"].T.reshape(D, N, H)
    a.k_DxKxH.value = sd[p + "self_attn.k_proj.weight"].T.reshape(D, K, H)
    a.v_DxKxH.value = sd[p + "self_attn.v_proj.weight"].T.reshape(D, K, H)
    a.o_NxHxD.value = sd[p + "self_attn.o_proj.weight"].T.reshape(N, H, D)
    if cfg.attention_bias:
      a.q_bias_NxH.value = sd[p + "self_attn.q_proj.bias"].reshape(N, H)
      a.k_bias_KxH.value = sd[p + "self_attn.k_proj.bias"].reshape(K, H)
      a.v_bias_KxH.value = sd[p + "self_attn.v_proj.bias"].reshape(K, H)
    layer.mlp.gate_DxF.value = sd[p + "mlp.gate_proj.weight"].T
    layer.mlp.up_DxF.value = sd[p + "mlp.up_proj.weight"].T
    layer.mlp.down_FxD.value = sd[p + "mlp.down_proj.weight"].T
  model.final_norm.scale.value = sd["model.norm.weight"]
  if not cfg.tie_word_embeddings:
    model.lm_head_DxV.value = sd["lm_head.weight"].T


def tiny_hf_model(kind: str, seed: int = 0):
  """A random Qwen2 (GQA, q/k/v bias, untied) or Llama (tied, llama3 rope scaling) with spread-out logits."""
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
  else:
    raise ValueError(kind)
  torch.manual_seed(seed)
  hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
  # Random biases too (they are zero-initialized), so a missing bias would show.
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if name.endswith("bias"):
        p.normal_(0.0, 0.2)
  return hf


def jax_twin(hf) -> Transformer:
  cfg = from_hf_config(hf.config.to_dict())
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  hf_to_params(hf, model)
  return model


@pytest.fixture(scope="session")
def qwen2_pair():
  hf = tiny_hf_model("qwen2")
  return hf, jax_twin(hf)


@pytest.fixture(scope="session")
def llama_pair():
  hf = tiny_hf_model("llama", seed=1)
  return hf, jax_twin(hf)


def teacher_forced_logits(model: Transformer, res) -> np.ndarray:
  """float64 [B, N, V]: the logits from which each completion token of `res` (a SampleResult) was drawn,
  recomputed by one full forward pass without a cache (an independent path from the sampler's decode)."""
  from grpo_jax.model import causal_attention_mask, positions_from_mask
  tokens = np.concatenate([res.prompt_BxP, res.completion_BxN], axis=1)
  fwd_mask = np.concatenate([res.prompt_mask_BxP, np.ones_like(res.completion_mask_BxN)], axis=1).astype(bool)
  hidden, _ = model(tokens, positions_from_mask(fwd_mask), causal_attention_mask(fwd_mask))
  P, N = res.prompt_BxP.shape[1], res.completion_BxN.shape[1]
  return np.asarray(model.logits(hidden[:, P - 1:P - 1 + N]), np.float64)


def random_prompts(rng: np.random.Generator, lengths, vocab_size: int, low: int = 3):
  return [rng.integers(low, vocab_size, n).tolist() for n in lengths]
