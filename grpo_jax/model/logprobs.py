"""Per-token log-probs (and entropies) of chosen tokens without materializing [B, L, V] logits.

The sequence is processed in chunks of `chunk_size` positions; each chunk's logits are computed, reduced to
logit[target] − logsumexp, and discarded. The chunk function is rematerialized so the backward pass does not
keep every chunk's logits either.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.model.transformer import Transformer


def causal_attention_mask(mask_BxL: jax.Array) -> jax.Array:
  """[B,L,L] bool: query t sees key s iff s <= t and key s is a real (non-padding) token."""
  L = mask_BxL.shape[1]
  causal = jnp.tril(jnp.ones((L, L), bool))
  return causal[None] & mask_BxL[:, None, :].astype(bool)


def positions_from_mask(mask_BxL: jax.Array) -> jax.Array:
  """Position ids that skip left padding: 0 at the first real token of each row."""
  return jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=1) - 1, 0)


def token_logprobs(hidden_BxTxD, out_DxV, targets_BxT, temperature: float = 1.0, chunk_size: int = 128,
                   with_entropy: bool = False):
  """log softmax(h·W / temperature)[target] per position, float32. Returns (logp_BxT, entropy_BxT or None)."""
  B, T, D = hidden_BxTxD.shape
  C = min(chunk_size, T)
  n = -(-T // C)
  pad = n * C - T
  h = jnp.pad(hidden_BxTxD, ((0, 0), (0, pad), (0, 0)))
  y = jnp.pad(targets_BxT, ((0, 0), (0, pad)))
  h_nxBxCxD = h.reshape(B, n, C, D).swapaxes(0, 1)
  y_nxBxC = y.reshape(B, n, C).swapaxes(0, 1)

  @jax.checkpoint
  def chunk(args):
    h_BxCxD, y_BxC = args
    logits = jnp.einsum("bcd,dv->bcv", h_BxCxD, out_DxV.astype(h_BxCxD.dtype),
                        preferred_element_type=jnp.float32) / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    logp = jnp.take_along_axis(logits, y_BxC[..., None], axis=-1)[..., 0] - lse
    if with_entropy:
      p = jax.nn.softmax(logits, axis=-1)
      ent = lse - jnp.sum(p * logits, axis=-1)
    else:
      ent = jnp.zeros_like(logp)
    return logp, ent

  logp, ent = jax.lax.map(chunk, (h_nxBxCxD, y_nxBxC))
  logp = logp.swapaxes(0, 1).reshape(B, n * C)[:, :T]
  ent = ent.swapaxes(0, 1).reshape(B, n * C)[:, :T]
  return logp, (ent if with_entropy else None)


def completion_logprobs(model: Transformer, prompt_BxP, prompt_mask_BxP, completion_BxC, completion_mask_BxC,
                        temperature: float = 1.0, chunk_size: int = 128, with_entropy: bool = False):
  """Log-probs of completion tokens given left-padded prompts, as the sampler produced them.

  Returns (logp_BxC, entropy_BxC or None); values at masked completion positions are meaningless (mask them).
  """
  tokens = jnp.concatenate([prompt_BxP, completion_BxC], axis=1)
  mask = jnp.concatenate([prompt_mask_BxP, completion_mask_BxC], axis=1).astype(bool)
  # Completion positions after the stop token are masked out but still need valid (causal) attention rows;
  # treat them as real tokens for the forward pass: only left padding of the prompt is excluded.
  fwd_mask = jnp.concatenate([prompt_mask_BxP.astype(bool), jnp.ones_like(completion_mask_BxC, bool)], axis=1)
  del mask
  positions = positions_from_mask(fwd_mask)
  hidden, _ = model(tokens, positions, causal_attention_mask(fwd_mask))
  P = prompt_BxP.shape[1]
  C = completion_BxC.shape[1]
  h = hidden[:, P - 1:P - 1 + C]  # the state before each completion token predicts it
  return token_logprobs(h, model.output_matrix_DxV(), completion_BxC, temperature, chunk_size, with_entropy)
