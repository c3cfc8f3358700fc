"""Cached decoding (prefill, then one token at a time with `init_cache`) equals one full forward pass."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import (ModelConfig, RopeScaling, Transformer, causal_attention_mask, init_cache,
                            positions_from_mask)
from tests.tolerance import assert_close_f32

# Compared with float64 / transformers: full float32 matmuls (TF32 by default on NVIDIA GPUs).
pytestmark = pytest.mark.usefixtures("float32_matmuls")


def test_prefill_then_single_token_steps_equal_full_forward():
  cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=40, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, attention_bias=True, qk_norm=True,
                    rope_scaling=RopeScaling(8.0, 1.0, 4.0, 16), rope_theta=500.0)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  B, P, N = 3, 6, 4
  S = P + N
  lengths = np.array([6, 4, 1])
  prompt_mask = np.arange(P)[None] >= P - lengths[:, None]
  tokens = np.where(np.concatenate([prompt_mask, np.ones((B, N), bool)], 1),
                    rng.integers(1, 50, size=(B, S)), 0).astype(np.int32)
  key_mask_BxS = np.concatenate([prompt_mask, np.ones((B, N), bool)], 1)
  positions_BxS = np.asarray(positions_from_mask(key_mask_BxS))

  graphdef, state = nnx.split(model)

  @jax.jit  # one compilation per shape (full, prefill, step) instead of one per op-by-op shape.
  def logits_and_cache(state, tokens, positions, mask, cache, cache_index):
    model = nnx.merge(graphdef, state)
    hidden, new_cache = model(tokens, positions, mask, cache=cache, cache_index=cache_index)
    return model.logits(hidden), new_cache

  full_logits, _ = logits_and_cache(state, tokens, positions_BxS, causal_attention_mask(key_mask_BxS), None, 0)
  full_logits = np.asarray(full_logits)

  # Prefill: queries 0..P-1 against all S cache slots (slots >= P not yet written are causally masked).
  causal_PxS = np.arange(S)[None, :] <= np.arange(P)[:, None]
  cache = init_cache(cfg, B, S)
  logits, cache = logits_and_cache(state, tokens[:, :P], positions_BxS[:, :P],
                                   causal_PxS[None] & key_mask_BxS[:, None], cache, jnp.int32(0))
  step_logits = [np.asarray(logits)]
  for t in range(P, S):
    mask_Bx1xS = (np.arange(S) <= t)[None, None] & key_mask_BxS[:, None]
    logits, cache = logits_and_cache(state, tokens[:, t:t + 1], positions_BxS[:, t:t + 1], mask_Bx1xS, cache,
                                     jnp.int32(t))
    step_logits.append(np.asarray(logits))
  cached_logits = np.concatenate(step_logits, axis=1)
  assert len(cache) == cfg.num_layers and cache[0].k_BxKxHxS.shape == (B, 2, 8, S)
  assert cache[0].v_BxKxSxH.shape == (B, 2, S, 8)
  # Step by step through the cache against the whole forward: 1.4 ulps of the largest logit seen; 256, the old
  # atol at logits this small (~0.45).
  assert_close_f32(cached_logits[key_mask_BxS], full_logits[key_mask_BxS], ulps=256)
