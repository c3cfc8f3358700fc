"""The gated delta rule (Gated DeltaNet; Yang et al. 2024, arXiv:2412.06464), the linear-attention mixer of Qwen3.5's
linear layers, in two forms that compute the same thing:

  `recurrent`: one token at a time (decode): with S [Dk, Dv] the head's state,
      S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - k_t S))^T;   o_t = q_t S
  `chunked`:   chunks of C tokens (prefill and training): within a chunk the C delta-rule updates become one
               unit-lower-triangular solve (the "UT transform") and a few matmuls; a scan carries S across chunks.

Shapes: B batch, T tokens, Hk query/key heads, Hv value heads (a multiple of Hk: each query/key head serves Hv / Hk
consecutive value heads), Dk key dim, Dv value dim, C chunk length. g is the log of the decay (<= 0), beta the
write strength in [0, 1]. q and k are L2-normalized when `l2norm` (Qwen3.5 does) and q is scaled by Dk^-1/2.
Both forms compute in float32 and take and return the state [B, Hv, Dk, Dv], so a prefill's final state starts the
decode. A position with g = 0 and beta = 0 leaves the state unchanged (how the caller keeps padding out of it).
Matches transformers' torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule (tests/model/test_gated_delta.py
compares both forms with a per-token numpy loop).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _prepare(q_BxTxHkxDk, k_BxTxHkxDk, v_BxTxHvxDv, g_BxTxHv, beta_BxTxHv, l2norm: bool):
  """float32 [B, Hv, T, ...] q (normalized, scaled), k, v, g, beta, the q/k heads repeated for their value heads."""
  repeat = v_BxTxHvxDv.shape[2] // k_BxTxHkxDk.shape[2]
  q, k = (jnp.repeat(x.astype(jnp.float32), repeat, axis=2) for x in (q_BxTxHkxDk, k_BxTxHkxDk))
  if l2norm:  # as the FLA kernels: x / sqrt(sum x^2 + 1e-6)
    q, k = (x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6) for x in (q, k))
  q = q * q.shape[-1] ** -0.5
  heads_first = lambda x: jnp.moveaxis(x.astype(jnp.float32), 2, 1)
  return heads_first(q), heads_first(k), heads_first(v_BxTxHvxDv), heads_first(g_BxTxHv), heads_first(beta_BxTxHv)


def recurrent(q_BxTxHkxDk, k_BxTxHkxDk, v_BxTxHvxDv, g_BxTxHv, beta_BxTxHv, state_BxHvxDkxDv=None,
              l2norm: bool = True):
  """(o [B, T, Hv, Dv] float32, final state [B, Hv, Dk, Dv]), one token at a time."""
  q, k, v, g, beta = _prepare(q_BxTxHkxDk, k_BxTxHkxDk, v_BxTxHvxDv, g_BxTxHv, beta_BxTxHv, l2norm)
  B, H, T, Dk = k.shape
  state = jnp.zeros((B, H, Dk, v.shape[-1]), jnp.float32) if state_BxHvxDkxDv is None else state_BxHvxDkxDv

  def step(S, x):
    q_t, k_t, v_t, g_t, b_t = x  # [B, H, D*] / [B, H]
    S = S * jnp.exp(g_t)[..., None, None]
    delta = (v_t - jnp.einsum("bhk,bhkv->bhv", k_t, S)) * b_t[..., None]
    S = S + k_t[..., :, None] * delta[..., None, :]
    return S, jnp.einsum("bhk,bhkv->bhv", q_t, S)

  time_first = lambda x: jnp.moveaxis(x, 2, 0)
  state, o_TxBxHxDv = jax.lax.scan(step, state, tuple(map(time_first, (q, k, v, g, beta))))
  return jnp.moveaxis(o_TxBxHxDv, 0, 1), state


def _unit_lower_inverse(strict_xCxC):
  """(I + N)^-1 for N strictly lower triangular [..., C, C], float32. On CPUs by forward substitution, row by row
  (row i of the inverse is e_i - N_i (rows < i)): XLA:CPU runs triangular_solve as a LAPACK call that splits its
  batch over the intra-op thread pool and waits for it, and two such calls running at once (independent solves
  of one program) deadlocked jaxlib 0.10.2 on a 2-core machine. GPUs and TPUs take XLA's triangular solve."""
  C = strict_xCxC.shape[-1]
  eye = jnp.broadcast_to(jnp.eye(C, dtype=strict_xCxC.dtype), strict_xCxC.shape)
  if jax.default_backend() != "cpu":
    return jax.lax.linalg.triangular_solve(eye + strict_xCxC, eye, left_side=True, lower=True, unit_diagonal=True)

  def row(i, inverse):
    return inverse.at[..., i, :].set(eye[..., i, :] - jnp.einsum("...j,...jk->...k", strict_xCxC[..., i, :], inverse))
  return jax.lax.fori_loop(1, C, row, eye)


@jax.custom_vjp
def unit_lower_solve(strict_xCxC, rhs_xCxD):
  """X = (I + N)^-1 R for N strictly lower triangular [..., C, C] and R [..., C, D]."""
  return _unit_lower_inverse(strict_xCxC) @ rhs_xCxD


def _solve_fwd(strict, rhs):
  inverse = _unit_lower_inverse(strict)
  x = inverse @ rhs
  return x, (inverse, x)


def _solve_bwd(residuals, x_bar):
  # dX = T (dR - dN X) with T = (I + N)^-1: R's cotangent is T^T X_bar, N's is -(T^T X_bar) X^T on its strictly
  # lower entries (the only ones N has).
  inverse, x = residuals
  rhs_bar = jnp.swapaxes(inverse, -1, -2) @ x_bar
  C = x.shape[-2]
  return jnp.where(jnp.tri(C, k=-1, dtype=bool), -rhs_bar @ jnp.swapaxes(x, -1, -2), 0.0), rhs_bar


unit_lower_solve.defvjp(_solve_fwd, _solve_bwd)


def chunked(q_BxTxHkxDk, k_BxTxHkxDk, v_BxTxHvxDv, g_BxTxHv, beta_BxTxHv, state_BxHvxDkxDv=None, chunk: int = 64,
            l2norm: bool = True):
  """(o [B, T, Hv, Dv] float32, final state [B, Hv, Dk, Dv]), C = `chunk` tokens at a time.

  In a chunk with cumulative log-decay c_i, the state after token i is exp(c_i) S0 plus the tokens' corrections
  u_j k_j^T decayed by exp(c_i - c_j); the corrections solve (I + L) u = beta v - W S0, L_ij = beta_i k_i.k_j
  exp(c_i - c_j) for j < i, W_i = beta_i exp(c_i) k_i: one triangular solve (`unit_lower_solve`) gives both
  u0 = (I + L)^-1 beta v and W' = (I + L)^-1 W, then u = u0 - W' S0 per chunk.
  """
  q, k, v, g, beta = _prepare(q_BxTxHkxDk, k_BxTxHkxDk, v_BxTxHvxDv, g_BxTxHv, beta_BxTxHv, l2norm)
  B, H, T, Dk = k.shape
  Dv = v.shape[-1]
  C = min(chunk, T)
  pad = -T % C
  pad_t = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 3))  # g = beta = 0: no-op tokens
  q, k, v, g, beta = map(pad_t, (q, k, v, g, beta))
  N = (T + pad) // C
  chunks = lambda x: x.reshape(B, H, N, C, *x.shape[3:])
  q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
  c = jnp.cumsum(g, axis=-1)  # [B, H, N, C]
  lower = jnp.tril(jnp.ones((C, C), bool))
  decay_CxC = jnp.exp(jnp.where(lower, c[..., :, None] - c[..., None, :], -jnp.inf))  # exp(c_i - c_j), j <= i
  k_beta = k * beta[..., None]
  strict = jnp.where(jnp.eye(C, dtype=bool), 0.0, jnp.einsum("bhnik,bhnjk->bhnij", k_beta, k) * decay_CxC)
  solved = unit_lower_solve(strict, jnp.concatenate([v * beta[..., None], k_beta * jnp.exp(c)[..., None]], -1))
  u0, w = solved[..., :Dv], solved[..., Dv:]                   # [B, H, N, C, Dv], [B, H, N, C, Dk]
  attn = jnp.einsum("bhnik,bhnjk->bhnij", q, k) * decay_CxC    # within the chunk, j <= i
  q_decayed = q * jnp.exp(c)[..., None]
  k_to_end = k * jnp.exp(c[..., -1:] - c)[..., None]
  chunk_decay = jnp.exp(c[..., -1])                            # [B, H, N]
  state = jnp.zeros((B, H, Dk, Dv), jnp.float32) if state_BxHvxDkxDv is None else state_BxHvxDkxDv

  def step(S, x):
    u0_n, w_n, attn_n, q_n, k_n, decay_n = x
    u = u0_n - jnp.einsum("bhck,bhkv->bhcv", w_n, S)
    o = jnp.einsum("bhck,bhkv->bhcv", q_n, S) + jnp.einsum("bhij,bhjv->bhiv", attn_n, u)
    return S * decay_n[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", k_n, u), o

  chunk_first = lambda x: jnp.moveaxis(x, 2, 0)
  state, o_NxBxHxCxDv = jax.lax.scan(step, state, tuple(map(chunk_first, (u0, w, attn, q_decayed, k_to_end,
                                                                          chunk_decay))))
  o = jnp.moveaxis(o_NxBxHxCxDv, 0, 2).reshape(B, H, N * C, Dv)[:, :, :T]
  return jnp.moveaxis(o, 1, 2), state
