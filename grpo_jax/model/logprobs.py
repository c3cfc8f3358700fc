"""Per-token log-probs (and entropies) of chosen tokens without materializing [B, T, V] logits.

The sequence is processed in chunks of `chunk_size` positions; each chunk's logits are computed, reduced to
logit[target] − logsumexp, and discarded. The chunk function is rematerialized so the backward pass does not
keep every chunk's logits either.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.model.transformer import Transformer, extend_cache, init_cache, softcap


def causal_attention_mask(mask_BxT: jax.Array) -> jax.Array:
  """[B,T,T] bool: query t sees key s iff s <= t and key s is a real (non-padding) token."""
  T = mask_BxT.shape[1]
  causal = jnp.tril(jnp.ones((T, T), bool))
  return causal[None] & mask_BxT[:, None, :].astype(bool)


def positions_from_mask(mask_BxT: jax.Array) -> jax.Array:
  """Position ids that skip left padding: 0 at the first real token of each row."""
  return jnp.maximum(jnp.cumsum(mask_BxT.astype(jnp.int32), axis=1) - 1, 0)


def head_logits(h_BxCxD: jax.Array, w_DxV: jax.Array) -> jax.Array:
  """[B, C, V] float32 logits of compute-dtype operands (accumulated in float32).

  In bfloat16 or float16, the backward multiplies in that dtype too (`_low_precision_logits`). Left to autodiff,
  the float32 cotangent of the logits would make both backward products float32 matmuls (h and W cast up; TF32
  on NVIDIA GPUs, at half the bf16 rate, and twice the bytes), the only float32 matmuls of a bf16 update.
  In float32 the plain product is used, so float32 runs round exactly as before."""
  if h_BxCxD.dtype == jnp.float32:
    return jnp.einsum("bcd,dv->bcv", h_BxCxD, w_DxV, preferred_element_type=jnp.float32)
  return _low_precision_logits(h_BxCxD, w_DxV)


@jax.custom_vjp
def _low_precision_logits(h_BxCxD, w_DxV):
  return jnp.einsum("bcd,dv->bcv", h_BxCxD, w_DxV, preferred_element_type=jnp.float32)


def _low_precision_logits_fwd(h_BxCxD, w_DxV):
  return _low_precision_logits(h_BxCxD, w_DxV), (h_BxCxD, w_DxV)


def _low_precision_logits_bwd(saved, g_BxCxV):
  h_BxCxD, w_DxV = saved
  g = g_BxCxV.astype(h_BxCxD.dtype)  # the logits' cotangent rounded to the compute dtype, as a layer's output's is
  dh = jnp.einsum("bcv,dv->bcd", g, w_DxV, preferred_element_type=jnp.float32).astype(h_BxCxD.dtype)
  dw = jnp.einsum("bcd,bcv->dv", h_BxCxD, g, preferred_element_type=jnp.float32).astype(w_DxV.dtype)
  return dh, dw


_low_precision_logits.defvjp(_low_precision_logits_fwd, _low_precision_logits_bwd)


def token_logprobs(hidden_BxTxD, out_DxV, targets_BxT, temperature: float = 1.0, chunk_size: int = 128,
                   with_entropy: bool = False, logit_softcap: float | None = None):
  """log softmax(h·W / temperature)[target] per position, float32 (h·W soft-capped first with `logit_softcap`:
  Gemma 4's final_logit_softcapping, as `Transformer.logits`). Returns (logp_BxT, entropy_BxT or None)."""
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
    logits = softcap(head_logits(h_BxCxD, out_DxV.astype(h_BxCxD.dtype)), logit_softcap) / temperature
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
                        temperature: float = 1.0, chunk_size: int = 128, with_entropy: bool = False,
                        prompt_repeats: int = 1, with_routing: bool = False, experts_BxTxLxk=None):
  """Log-probs of completion tokens given left-padded prompts, as the sampler produced them.

  `prompt_repeats` = s > 1: rows come in consecutive runs of s that share one prompt (a GRPO group, or an
  aligned part of one); each prompt then runs through the model once and its s completions attend to its
  keys and values (`_shared_prompt_hidden`) instead of each row recomputing it. Same result up to float
  rounding (tests/model/test_shared_prompt.py).

  Returns (logp_BxC, entropy_BxC or None); values at masked completion positions are meaningless (mask them).
  `with_routing` adds a third item, one (router logits [N, E], the router's top k [N, k], valid [N]) per expert
  layer over the N token positions the forward ran (valid: real prompt and completion tokens), in the order of
  `routing_order`. `experts_BxTxLxk` (the sampler's, over prompt + completion columns): routing replay, each
  expert layer uses those experts (moe.MoE).
  """
  if prompt_repeats > 1:
    h, routing = _shared_prompt_hidden(model, prompt_BxP, prompt_mask_BxP, completion_BxC, completion_mask_BxC,
                                       prompt_repeats, experts_BxTxLxk)
  else:
    h, routing = _per_row_hidden(model, prompt_BxP, prompt_mask_BxP, completion_BxC, completion_mask_BxC,
                                 experts_BxTxLxk)
  out = token_logprobs(h, model.output_matrix_DxV(), completion_BxC, temperature, chunk_size, with_entropy,
                       model.cfg.final_logit_softcapping)
  return (*out, routing) if with_routing else out


def routing_order(x_BxTx_, P: int, prompt_repeats: int = 1):
  """[N, ...]: a per-token array over prompt + completion columns (the sampler's experts [B, T, L, k], a mask) in
  the token order of `completion_logprobs`'s routing: row by row over all columns, or with prompt_repeats > 1 each
  run's prompt once, then every completion."""
  flat = lambda x: x.reshape(-1, *x.shape[2:])
  if prompt_repeats == 1:
    return flat(x_BxTx_)
  return jnp.concatenate([flat(x_BxTx_[::prompt_repeats, :P]), flat(x_BxTx_[:, P:])])


def _columns(experts_BxTxLxk, columns: slice, every: int = 1):
  return None if experts_BxTxLxk is None else experts_BxTxLxk[::every, columns]


def _layers(experts_BxTxLxk):
  """Per expert layer [B, T, k], or None (no replay)."""
  return None if experts_BxTxLxk is None else [experts_BxTxLxk[:, :, i] for i in range(experts_BxTxLxk.shape[2])]


def _flat_routing(routing, valid_BxT):
  return tuple((logits.reshape(-1, logits.shape[-1]), experts.reshape(-1, experts.shape[-1]), valid_BxT.reshape(-1))
               for logits, experts in routing)


def _per_row_hidden(model: Transformer, prompt_BxP, prompt_mask_BxP, completion_BxC, completion_mask_BxC,
                    experts_BxTxLxk=None):
  """([B, C, D]: the hidden state before each completion token (the one that predicts it), routing), one forward
  pass over each row's prompt + completion."""
  tokens = jnp.concatenate([prompt_BxP, completion_BxC], axis=1)
  # Completion positions after the stop token are masked out of the loss but still need valid (causal)
  # attention rows; treat them as real tokens for the forward pass: only left padding of the prompt is excluded.
  fwd_mask = jnp.concatenate([prompt_mask_BxP.astype(bool), jnp.ones_like(completion_BxC, bool)], axis=1)
  hidden, _, routing = model(tokens, positions_from_mask(fwd_mask), causal_attention_mask(fwd_mask),
                             experts=_layers(experts_BxTxLxk), with_routing=True)
  P, C = prompt_BxP.shape[1], completion_BxC.shape[1]
  real = jnp.concatenate([prompt_mask_BxP.astype(bool), completion_mask_BxC.astype(bool)], axis=1)
  return hidden[:, P - 1:P - 1 + C], _flat_routing(routing, real)


def _shared_prompt_hidden(model: Transformer, prompt_BxP, prompt_mask_BxP, completion_BxC, completion_mask_BxC,
                          repeats: int, experts_BxTxLxk=None):
  """What `_per_row_hidden` returns, with each prompt run once for its `repeats` consecutive rows.

  Pass 1 runs the R = B / repeats distinct prompts and keeps every layer's keys and values (a KV cache of
  length P). Pass 2 runs the B completions over that cache, repeated to their rows and extended by C slots:
  completion token t attends to its prompt's real tokens and to completion tokens <= t, at positions
  prompt length + t, exactly as in the per-row pass. Gradients reach the prompt's pass through the cache
  (summed over its rows). For a GRPO group of G rows this runs P + G·C positions instead of G·(P + C), the
  shared-prefix forward of Prefix Grouper (Liu et al. 2025, arXiv:2506.05433).
  """
  cfg = model.cfg
  B, P = prompt_BxP.shape
  C = completion_BxC.shape[1]
  if B % repeats:
    raise ValueError(f"{B} rows are not whole runs of prompt_repeats={repeats}")
  prompt_RxP = prompt_BxP[::repeats]
  real_RxP = prompt_mask_BxP[::repeats].astype(bool)
  hidden_RxPxD, cache, prompt_routing = model(
      prompt_RxP, positions_from_mask(real_RxP), causal_attention_mask(real_RxP),
      cache=init_cache(cfg, prompt_RxP.shape[0], P), cache_index=0, remat=cfg.remat, with_routing=True,
      experts=_layers(_columns(experts_BxTxLxk, slice(None, P), repeats)))

  def to_rows(x):
    return jnp.repeat(x, repeats, axis=0)

  cache_B = extend_cache(cfg, jax.tree.map(to_rows, cache), C)
  real_BxP = to_rows(real_RxP)
  positions_BxC = jnp.sum(real_BxP, axis=1, dtype=jnp.int32)[:, None] + jnp.arange(C, dtype=jnp.int32)
  causal_CxC = jnp.tril(jnp.ones((C, C), bool))
  mask_BxCxS = jnp.concatenate([jnp.broadcast_to(real_BxP[:, None, :], (B, C, P)),
                                jnp.broadcast_to(causal_CxC, (B, C, C))], axis=2)
  hidden_BxCxD, _, completion_routing = model(
      completion_BxC, positions_BxC, mask_BxCxS, cache=cache_B, cache_index=P, remat=cfg.remat, with_routing=True,
      experts=_layers(_columns(experts_BxTxLxk, slice(P, None))))
  routing = tuple(tuple(jnp.concatenate(pair) for pair in zip(p, c)) for p, c in zip(
      _flat_routing(prompt_routing, real_RxP), _flat_routing(completion_routing, completion_mask_BxC.astype(bool))))
  # The prompt's last state predicts completion token 0; completion state t predicts token t + 1.
  return jnp.concatenate([to_rows(hidden_RxPxD[:, -1:]), hidden_BxCxD[:, :-1]], axis=1), routing
