"""Token entropy and the "80/20" high-entropy token selection.

H_t = −Σ_v p_v log p_v = logsumexp(z) − Σ_v softmax(z)_v z_v for logits z (already divided by the sampling
temperature). `entropy_from_logits` materializes [.., V] and is meant for tests and small vocabularies; the
training path gets H_t chunked from `grpo_jax.model.logprobs.token_logprobs(..., with_entropy=True)`.

Top-entropy selection (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective Reinforcement Learning for LLM Reasoning", arXiv:2506.01939; TRL `top_entropy_quantile`): keep the
policy-gradient term only on the fraction q of completion tokens with the highest entropy, i.e. on tokens with
H_t ≥ quantile_{1−q}(H over all real tokens). The quantile interpolates linearly (as numpy/torch do), ties at
the threshold are kept, and q = 1 keeps every real token.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def entropy_from_logits(logits_xV: jax.Array) -> jax.Array:
  """Entropy in nats of softmax(logits) over the last axis; [..., V] -> [...] float32."""
  z = logits_xV.astype(jnp.float32)
  lse = jax.nn.logsumexp(z, axis=-1)
  return lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)


def top_entropy_mask(entropy_BxT: jax.Array, mask_BxT: jax.Array, quantile: float) -> jax.Array:
  """bool [B, T]: real tokens whose entropy is in the top `quantile` fraction of this call's real tokens.

  The threshold is computed over every real token passed in, so call it on the tokens that should share one
  threshold (TRL computes it per micro-batch). No real tokens: an all-False mask.
  """
  if not 0.0 < quantile <= 1.0:
    raise ValueError(f"top_entropy_quantile must be in (0, 1], got {quantile}")
  mask = mask_BxT.astype(bool)
  ent = jax.lax.stop_gradient(entropy_BxT).astype(jnp.float32)
  threshold = jnp.nanquantile(jnp.where(mask, ent, jnp.nan), 1.0 - quantile)
  return mask & (ent >= threshold)
