"""One decode step's grouped-query attention as one Pallas kernel (`ModelConfig.decode_attention="pallas"`).

XLA computes a token step's attention in several kernels per layer (q @ K, the mask and softmax, p @ V), with
the [B, N, S] scores going through memory between them, and it reads every slot of the KV cache whether filled
or not. This kernel runs one program per (row, kv head): it reads that head's keys and values once, block by
block, keeps FlashAttention's running max and sum in registers, and stops after the block that holds slot
`length - 1` (the slots after it are never read, which `SamplingConfig.decode_segment` otherwise gets by
re-padding the cache).

On NVIDIA GPUs it is lowered through Triton; on the CPU it runs in Pallas' interpreter (tests only: it is
slow), and its backward is the einsum reference's (`reference_decode_attention`), so a training forward that
happens to take this path stays differentiable. Under a multi-device mesh XLA cannot split the kernel: use
"einsum" there.

Shapes, as the KV cache stores them (grpo_jax/model/transformer.py): q [B, K, Q, H] (Q query heads per kv
head), keys [B, K, H, S], values [B, K, S, H], key_ok [B, S] (the step's attention mask), length a scalar.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)


def _pallas_modules():
  """Imported on first use: Pallas' Triton bindings add ~0.15 s to every process that imports the model."""
  from jax.experimental import pallas
  from jax.experimental.pallas import triton
  return pallas, triton


def _pow2_at_least(n: int, floor: int) -> int:
  return max(floor, 1 << (n - 1).bit_length())


def block_slots(head_dim: int) -> int:
  """Cache slots per loop iteration: 8192 / head_dim within [16, 128], so that a block of keys plus one of
  values stays at 32 KB in bfloat16 (Triton's dot needs every dimension >= 16)."""
  return max(16, min(128, 8192 // head_dim))


def _kernel(length_ref, q_ref, k_ref, v_ref, ok_ref, o_ref, *, groups: int, slots: int, block: int, scale: float):
  """One (row, kv head): q_ref [Qp, H] (rows >= `groups` are padding), k_ref [H, S], v_ref [S, H], ok_ref [S],
  o_ref [Qp, H]."""
  pl, pltriton = _pallas_modules()
  # float32 inputs in full float32 (Triton's default is TF32); bfloat16 ones are unaffected.
  dot = functools.partial(pltriton.dot, precision=jax.lax.Precision.HIGHEST)
  Qp, H = q_ref.shape
  rows_ok = jnp.arange(Qp) < groups
  q = pltriton.load(q_ref, mask=rows_ok[:, None], other=0)
  length = jnp.minimum(length_ref[0], slots)

  def body(j, carry):
    o_QxH, max_Q, sum_Q = carry
    start = pl.multiple_of(j * block, block)
    cols = start + jnp.arange(block)
    filled = cols < length  # length <= slots: the last block may run past the filled slots and the cache
    k_HxS = pltriton.load(k_ref.at[:, pl.ds(start, block)], mask=filled[None, :], other=0)
    # Zeros, not whatever the unfilled slots hold: their probabilities are 0, but 0 * inf is not.
    v_SxH = pltriton.load(v_ref.at[pl.ds(start, block), :], mask=filled[:, None], other=0)
    seen = pltriton.load(ok_ref.at[pl.ds(start, block)], mask=filled, other=0) != 0
    scores = jnp.where(seen[None, :], dot(q, k_HxS) * scale, -jnp.inf)  # [Qp, block], float32
    new_max = jnp.maximum(max_Q, scores.max(axis=1))
    # A row that has seen no key yet keeps max -inf; its terms are zero, not exp(-inf - -inf).
    probs = jnp.where(seen[None, :], jnp.exp(scores - new_max[:, None]), 0.0)
    shrink = jnp.where(new_max == -jnp.inf, 1.0, jnp.exp(max_Q - new_max))
    o_QxH = o_QxH * shrink[:, None] + dot(probs.astype(v_SxH.dtype), v_SxH)
    return o_QxH, new_max, sum_Q * shrink + probs.sum(axis=1)

  init = (jnp.zeros((Qp, H), jnp.float32), jnp.full((Qp,), -jnp.inf, jnp.float32), jnp.zeros((Qp,), jnp.float32))
  o_QxH, _, sum_Q = jax.lax.fori_loop(0, pl.cdiv(length, block), body, init)
  out = o_QxH / jnp.where(sum_Q > 0, sum_Q, 1.0)[:, None]  # a row with no key seen: zeros
  pltriton.store(o_ref, out.astype(o_ref.dtype), mask=rows_ok[:, None])


def pallas_decode_attention(q_BxKxQxH, k_BxKxHxS, v_BxKxSxH, key_ok_BxS, length, scale: float, interpret: bool):
  """The kernel alone (no backward): `interpret` runs it in Pallas' interpreter, else it is lowered for Triton."""
  pl, pltriton = _pallas_modules()
  B, K, Q, H = q_BxKxQxH.shape
  S = v_BxKxSxH.shape[2]
  Qp = _pow2_at_least(Q, 16)  # Triton's dot: every dimension a power of two >= 16
  kernel = functools.partial(_kernel, groups=Q, slots=S, block=block_slots(H), scale=scale)
  return pl.pallas_call(
      kernel,
      grid=(B, K),
      in_specs=[pl.BlockSpec((1,), lambda b, k: (0,)),
                pl.BlockSpec((None, None, Qp, H), lambda b, k: (b, k, 0, 0)),
                pl.BlockSpec((None, None, H, S), lambda b, k: (b, k, 0, 0)),
                pl.BlockSpec((None, None, S, H), lambda b, k: (b, k, 0, 0)),
                pl.BlockSpec((None, S), lambda b, k: (b, 0))],
      out_specs=pl.BlockSpec((None, None, Qp, H), lambda b, k: (b, k, 0, 0)),
      out_shape=jax.ShapeDtypeStruct(q_BxKxQxH.shape, q_BxKxQxH.dtype),
      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name="grpo_decode_attention",
  )(jnp.reshape(length, (1,)).astype(jnp.int32), q_BxKxQxH, k_BxKxHxS, v_BxKxSxH, key_ok_BxS.astype(jnp.int32))


def reference_decode_attention(q_BxKxQxH, k_BxKxHxS, v_BxKxSxH, key_ok_BxS, length, scale: float):
  """The same function in jnp (float32 scores, as the model's einsum path): slots >= `length` are masked."""
  S = v_BxKxSxH.shape[2]
  seen_BxS = key_ok_BxS & (jnp.arange(S) < length)[None]
  scores = jnp.einsum("bkgh,bkhs->bkgs", q_BxKxQxH, k_BxKxHxS, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(seen_BxS[:, None, None], scores, -jnp.inf)
  top = jnp.max(scores, axis=-1, keepdims=True)
  probs = jnp.where(seen_BxS[:, None, None], jnp.exp(scores - jnp.where(top == -jnp.inf, 0.0, top)), 0.0)
  total = jnp.sum(probs, axis=-1, keepdims=True)
  probs = probs / jnp.where(total > 0, total, 1.0)
  return jnp.einsum("bkgs,bksh->bkgh", probs.astype(v_BxKxSxH.dtype), v_BxKxSxH,
                    preferred_element_type=jnp.float32).astype(q_BxKxQxH.dtype)


@functools.cache
def _warn_interpreted(platform: str) -> None:
  """Once per process (each layer of each traced program would say it again)."""
  log.warning("model.decode_attention='pallas' on %s runs in Pallas' interpreter, which is for tests and slow; "
              "decode_attention='einsum' is XLA's compiled path", platform)


def check_supported(head_dim: int, platform: str) -> None:
  """Raises ValueError where the kernel cannot run: Triton needs a power-of-two head_dim >= 16; TPUs have no
  Triton (their Pallas backend is Mosaic, for which this kernel is not written)."""
  if platform == "tpu":
    raise ValueError("model.decode_attention='pallas' is a Triton kernel for NVIDIA GPUs (and the CPU's "
                     "interpreter, for tests); on a TPU use decode_attention='einsum'")
  if platform == "gpu" and (head_dim < 16 or head_dim & (head_dim - 1)):
    raise ValueError(f"model.decode_attention='pallas' needs head_dim a power of two >= 16 on a GPU, this "
                     f"model has {head_dim}; use decode_attention='einsum'")


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _decode_attention(q, k, v, key_ok, length, scale, interpret):
  return pallas_decode_attention(q, k, v, key_ok, length, scale, interpret)


def _forward(q, k, v, key_ok, length, scale, interpret):
  return pallas_decode_attention(q, k, v, key_ok, length, scale, interpret), (q, k, v, key_ok, length)


def _backward(scale, interpret, saved, grad):
  q, k, v, key_ok, length = saved
  _, vjp = jax.vjp(lambda q, k, v: reference_decode_attention(q, k, v, key_ok, length, scale), q, k, v)
  return (*vjp(grad), None, None)


_decode_attention.defvjp(_forward, _backward)


def decode_attention(q_BxKxQxH, k_BxKxHxS, v_BxKxSxH, key_ok_BxS, length, scale: float):
  """[B, K, Q, H] in q's dtype: softmax(q K^T * scale) V over the slots s < `length` with key_ok[b, s]; a query
  that sees no key gets zeros. Keys and values are cast to q's dtype (the cache may be stored wider)."""
  platform = jax.default_backend()
  check_supported(q_BxKxQxH.shape[-1], platform)
  if platform != "gpu":
    _warn_interpreted(platform)
  dt = q_BxKxQxH.dtype
  return _decode_attention(q_BxKxQxH, k_BxKxHxS.astype(dt), v_BxKxSxH.astype(dt), key_ok_BxS, length, scale,
                           platform != "gpu")
