"""Choosing the next token from one position's logits: greedy, temperature, top-k, top-p.

Shapes: B batch, V vocabulary.

Everything here is made of elementwise ops and row reductions over V, because on CPU XLA's sort is ~30x
slower than a reduction (a full sort of 32x4096 floats took 36 ms, a reduction 0.2 ms) and its variadic
argmax and Gumbel noise (V random numbers per row) cost several reductions each:
- top-k keeps logits >= the k-th largest, found by bisection (`kth_largest`; XLA CPU turned `lax.top_k`
  into a full sort here);
- top-p finds its probability threshold by bisection instead of sorting (`nucleus_threshold`);
- sampling inverts the cumulative distribution at one uniform per row, in two levels of ~sqrt(V) entries
  (`sample_inverse_cdf`); the sampler draws every step's uniforms before its decode loop.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from grpo_jax.sampling.config import SamplingConfig


def first_argmax(x_BxV: jax.Array) -> jax.Array:
  """argmax over the last axis (the first index on ties, like torch and numpy), from two plain reductions."""
  V = x_BxV.shape[-1]
  is_max = x_BxV == jnp.max(x_BxV, axis=-1, keepdims=True)
  return jnp.min(jnp.where(is_max, jnp.arange(V, dtype=jnp.int32), V), axis=-1)


def _ordered_key(x):
  """uint32 keys ordered like the float32 values (flip all bits of negatives, the sign bit of the rest)."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _from_ordered_key(key):
  bits = jnp.where(key >> 31 == 1, key & jnp.uint32(0x7FFFFFFF), ~key)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def kth_largest(x_BxV: jax.Array, k: int) -> jax.Array:
  """[B] the k-th largest value of each row (1 <= k <= V), by bisection over order-preserving uint32 keys:
  the largest key t with #{x >= t} >= k is the k-th largest key. 32 steps of one compare-and-count each."""
  key_BxV = _ordered_key(x_BxV)

  def halve(_, lo_hi):
    lo_B, hi_B = lo_hi
    mid_B = lo_B + (hi_B - lo_B + 1) // 2  # upper middle, so lo = mid always moves
    ok_B = jnp.sum(key_BxV >= mid_B[:, None], axis=-1) >= k
    return jnp.where(ok_B, mid_B, lo_B), jnp.where(ok_B, hi_B, mid_B - 1)

  # Invariant: the answer lies in [lo, hi]; the row minimum always qualifies.
  lo_hi = (jnp.min(key_BxV, axis=-1), jnp.max(key_BxV, axis=-1))
  lo_B, _ = jax.lax.fori_loop(0, 32, halve, lo_hi)
  return _from_ordered_key(lo_B)


def nucleus_threshold(w_BxV: jax.Array, top_p: float) -> jax.Array:
  """[B] threshold tau: the top-p nucleus of the (unnormalized, >= 0) weights is {i : w_i >= tau}.

  Nucleus rule (HF, after sorting in decreasing order): keep a token when the normalized mass of the tokens
  strictly more likely than it is < top_p, i.e. the smallest most-likely set whose mass reaches top_p.
  That mass is non-increasing in w_i, so the kept set is {w_i >= tau} with tau the smallest float for which
  mass(w > tau) < top_p * sum(w). Non-negative float32 values are ordered like their int32 bit patterns, so
  tau is found exactly by bisection over those patterns: 31 steps of one compare-and-sum each.
  """
  target_B = top_p * jnp.sum(w_BxV, axis=-1)

  def mass_above_is_small(bits_B):
    tau_B = jax.lax.bitcast_convert_type(bits_B, jnp.float32)
    return jnp.sum(jnp.where(w_BxV > tau_B[:, None], w_BxV, 0.0), axis=-1) < target_B

  def halve(_, lo_hi):
    lo_B, hi_B = lo_hi
    mid_B = lo_B + (hi_B - lo_B) // 2
    ok_B = mass_above_is_small(mid_B)
    return jnp.where(ok_B, lo_B, mid_B + 1), jnp.where(ok_B, mid_B, hi_B)

  # Invariant: the answer lies in [lo, hi]; tau = max(w) always qualifies (nothing lies above it).
  lo_B = jnp.zeros(target_B.shape, jnp.int32)
  hi_B = jax.lax.bitcast_convert_type(jnp.max(w_BxV, axis=-1), jnp.int32)
  lo_B, _ = jax.lax.fori_loop(0, 31, halve, (lo_B, hi_B))
  return jax.lax.bitcast_convert_type(lo_B, jnp.float32)


def _block_size(V: int) -> int:
  """Power of two near sqrt(V): both levels of `sample_inverse_cdf` then scan ~sqrt(V) entries."""
  return 1 << max(0, math.ceil(math.log2(math.sqrt(V))))


def sample_inverse_cdf(u_B: jax.Array, w_BxV: jax.Array) -> jax.Array:
  """[B] int32 index i drawn with probability w_i / sum(w), given u_B uniform in [0, 1) (weights >= 0, at least
  one > 0 per row).

  Inverse CDF in two levels, so that no cumulative sum runs over the whole vocabulary (a [B, V] cumsum was the
  costliest op of a CPU decode step): the vocabulary is cut into blocks of ~sqrt(V) tokens; the block is
  chosen from the cumulative block sums, then the token from the cumulative sum inside that block. Token i is
  chosen when cdf_{i-1} <= u * total < cdf_i, so zero-weight tokens are never chosen; where rounding puts the
  target at or past a total, the last positive-weight block or token is taken.
  """
  B, V = w_BxV.shape
  blk = _block_size(V)
  nb = -(-V // blk)
  w_BxCbxBlk = jnp.pad(w_BxV, ((0, 0), (0, nb * blk - V))).reshape(B, nb, blk)
  block_w_BxCb = jnp.sum(w_BxCbxBlk, axis=-1)
  block_cdf_BxCb = jnp.cumsum(block_w_BxCb, axis=-1)
  target_B = u_B * block_cdf_BxCb[:, -1]
  last_block_B = jnp.max(jnp.where(block_w_BxCb > 0, jnp.arange(nb, dtype=jnp.int32), 0), axis=-1)
  block_B = jnp.minimum(jnp.sum(block_cdf_BxCb <= target_B[:, None], axis=-1, dtype=jnp.int32), last_block_B)
  before_B = jnp.take_along_axis(block_cdf_BxCb, block_B[:, None], axis=-1)[:, 0] - jnp.take_along_axis(
      block_w_BxCb, block_B[:, None], axis=-1)[:, 0]
  inner_w_BxBlk = jnp.take_along_axis(w_BxCbxBlk, block_B[:, None, None], axis=1)[:, 0]
  inner_cdf_BxBlk = jnp.cumsum(inner_w_BxBlk, axis=-1)
  last_inner_B = jnp.max(jnp.where(inner_w_BxBlk > 0, jnp.arange(blk, dtype=jnp.int32), 0), axis=-1)
  inner_B = jnp.minimum(jnp.sum(inner_cdf_BxBlk <= (target_B - before_B)[:, None], axis=-1, dtype=jnp.int32),
                        last_inner_B)
  return block_B * blk + inner_B


def select_next_token(logits_BxV: jax.Array, u_B: jax.Array, cfg: SamplingConfig):
  """Returns (token_B int32, logp_B float32) with logp = log_softmax(logits / T)[token] over the full
  vocabulary (the number the loss recomputes), whatever top-k / top-p / greedy truncated. `u_B`: uniform
  draws in [0, 1), one per row (unused when greedy)."""
  scaled_BxV = logits_BxV.astype(jnp.float32) / cfg.temperature
  V = scaled_BxV.shape[-1]
  max_B = jnp.max(scaled_BxV, axis=-1)
  w_BxV = jnp.exp(scaled_BxV - max_B[:, None])  # unnormalized probabilities, max 1
  logz_B = max_B + jnp.log(jnp.sum(w_BxV, axis=-1))
  if cfg.greedy:
    token_B = first_argmax(scaled_BxV)
  else:
    if 0 < cfg.top_k < V:
      kth_B = kth_largest(scaled_BxV, cfg.top_k)
      w_BxV = jnp.where(scaled_BxV >= kth_B[:, None], w_BxV, 0.0)
    if cfg.top_p < 1.0:
      w_BxV = jnp.where(w_BxV >= nucleus_threshold(w_BxV, cfg.top_p)[:, None], w_BxV, 0.0)
    token_B = sample_inverse_cdf(u_B, w_BxV)
  logp_B = jnp.take_along_axis(scaled_BxV, token_B[:, None], axis=-1)[:, 0] - logz_B
  return token_B, logp_B
