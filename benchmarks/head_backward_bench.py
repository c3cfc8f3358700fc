#!/usr/bin/env python
"""The LM head's backward in a bf16 update: float32 matmuls (autodiff) against bf16 ones (grpo_jax's).

  .venv/bin/python benchmarks/head_backward_bench.py                      # a CPU-sized shape
  .venv/bin/python benchmarks/head_backward_bench.py --rows 16 --positions 512 --hidden 896 --vocab 151936
                                                                           # one micro-batch of the 0.5B recipe

`token_logprobs` (grpo_jax/model/logprobs.py) takes each chunk's logits as a bf16 x bf16 product with float32
output. Left to autodiff, the logits' float32 cotangent makes both backward products (dlogits W^T, h^T dlogits)
float32 matmuls: TF32 on NVIDIA GPUs, at half the bf16 rate. grpo_jax's `head_logits` rounds that cotangent to
bf16 and multiplies in bf16 with float32 accumulation. Both variants run the same chunked log-probs with the
entropy, jitted value and gradient (h and W) of sum(logp) + 0.5 sum(entropy); the baseline is named
`float32_backward`. Prints each one's median of --repeats calls after the first, the ratio, and the largest
difference of the gradients relative to their largest entry. The gpu_campaign's `head_backward` part runs it at
the recipe's micro-batch shape.
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.model import logprobs


def _float32_backward(h_BxCxD, w_DxV):
  return jnp.einsum("bcd,dv->bcv", h_BxCxD, w_DxV, preferred_element_type=jnp.float32)


VARIANTS = {"float32_backward": _float32_backward, "bf16_backward": logprobs._low_precision_logits}


def gradient_fn(head, targets_BxT, chunk: int):
  """jit(grad) of sum(logp) + 0.5 sum(entropy) in (h, W), the head's product being `head`."""
  def loss(h_BxTxD, w_DxV):
    saved = logprobs.head_logits
    logprobs.head_logits = head  # token_logprobs looks the product up at trace time
    try:
      logp, ent = logprobs.token_logprobs(h_BxTxD, w_DxV, targets_BxT, chunk_size=chunk, with_entropy=True)
    finally:
      logprobs.head_logits = saved
    return jnp.sum(logp) + 0.5 * jnp.sum(ent)
  return jax.jit(jax.grad(loss, (0, 1)))


def measure(rows: int, positions: int, hidden: int, vocab: int, chunk: int, repeats: int, seed: int = 0) -> dict:
  """Median seconds per call of each variant, their ratio (baseline / bf16) and the gradients' difference."""
  keys = jax.random.split(jax.random.key(seed), 3)
  h = jax.random.normal(keys[0], (rows, positions, hidden), jnp.bfloat16)
  w = jax.random.normal(keys[1], (hidden, vocab), jnp.float32) * hidden ** -0.5
  y = jax.random.randint(keys[2], (rows, positions), 0, vocab)
  out, grads = {"shape": {"rows": rows, "positions": positions, "hidden": hidden, "vocab": vocab,
                          "chunk": chunk}, "device": jax.devices()[0].device_kind}, {}
  for name, head in VARIANTS.items():
    fn = gradient_fn(head, y, chunk)
    grads[name] = jax.block_until_ready(fn(h, w))  # compiles
    seconds = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(h, w))
      seconds.append(time.perf_counter() - t0)
    out[f"{name}_s"] = float(np.median(seconds))
  out["ratio"] = out["float32_backward_s"] / out["bf16_backward_s"]
  out["max_rel_diff"] = max(
      float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) / jnp.max(jnp.abs(b.astype(jnp.float32))))
      for a, b in zip(grads["bf16_backward"], grads["float32_backward"]))
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rows", type=int, default=8)
  p.add_argument("--positions", type=int, default=256)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--chunk", type=int, default=128)
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args(argv)
  r = measure(args.rows, args.positions, args.hidden, args.vocab, args.chunk, args.repeats)
  print(f"{r['device']}; rows {args.rows} x positions {args.positions}, hidden {args.hidden}, vocab {args.vocab}, "
        f"chunk {args.chunk}; load average {os.getloadavg()[0]:.2f}")
  print(f"float32_backward (baseline): {r['float32_backward_s'] * 1e3:.1f} ms; bf16_backward: "
        f"{r['bf16_backward_s'] * 1e3:.1f} ms; ratio {r['ratio']:.2f}x; gradients' max difference "
        f"{r['max_rel_diff']:.2e} of their largest entry")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
