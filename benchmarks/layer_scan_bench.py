#!/usr/bin/env python
"""What scanning over layers would save in compilation: the gradient of a log-likelihood through the model's
decoder stack, compiled with its layers unrolled (grpo_jax today: a Python loop, every layer in the program)
and with one layer body under `jax.lax.scan` over the layers' stacked weights (what MaxText and big_vision do).

  .venv/bin/python benchmarks/layer_scan_bench.py                      # SmolLM2-135M's shape, random weights
  .venv/bin/python benchmarks/layer_scan_bench.py --layers 8 --rows 8  # smaller

Both programs take the same weights and compute the same function (checked: loss and gradients agree to float32
rounding); the scanned one stacks the layers' weights inside the program (a copy per call, in its run time).
Prints per variant: XLA compile time (after tracing and lowering, timed apart), then the median of 5 runs.
A measurement for issue 33's first-step compile, not a code path of the trainer. Measured (2-core CPU,
2026-11-25, defaults): unrolled 2.0 s to compile, 6.42 s a run; scanned 3.1 s, 7.22 s; gradients equal. The 30
unrolled layers are not what makes the trainer's update take 35 s to compile (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.model.config import ModelConfig
from grpo_jax.model.logprobs import causal_attention_mask, positions_from_mask
from grpo_jax.model.transformer import FULL, Transformer


def loss_fn(scan: bool):
  def loss(state, graphdef, tokens_BxT):
    model = nnx.merge(graphdef, state)
    mask = jnp.ones(tokens_BxT.shape, bool)
    positions, attn = positions_from_mask(mask), causal_attention_mask(mask)
    x = jnp.take(model.embed_VxD[...], tokens_BxT, axis=0).astype(model.cfg.jnp_dtype)
    cos_sin = model.rope_tables(positions)[FULL]
    if scan:
      layer_graphdef, first = nnx.split(model.layers[0])
      stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.split(layer)[1] for layer in model.layers])

      def body(x, layer_state):
        return nnx.merge(layer_graphdef, layer_state)(x, cos_sin, attn, None, 0)[0], None

      x, _ = jax.lax.scan(body, x, stacked)
    else:
      for layer in model.layers:
        x, _ = layer(x, cos_sin, attn, None, 0)
    logits = model.logits(model.final_norm(x))
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return -jnp.take_along_axis(logp, tokens_BxT[:, 1:, None], axis=-1).mean()
  return loss


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", type=int, default=30)
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--length", type=int, default=96)
  args = parser.parse_args(argv)
  cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=args.layers, num_heads=9,
                    num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (args.rows, args.length)), jnp.int32)
  results = {}
  for name, scan in (("unrolled", False), ("scanned", True)):
    fn = jax.jit(jax.value_and_grad(loss_fn(scan)), static_argnums=1)
    t0 = time.perf_counter()
    lowered = fn.lower(state, graphdef, tokens)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    out = jax.block_until_ready(compiled(state, tokens))
    runs = []
    for _ in range(5):
      t = time.perf_counter()
      jax.block_until_ready(compiled(state, tokens))
      runs.append(time.perf_counter() - t)
    results[name] = out
    print(f"{name}: trace+lower {t1 - t0:.1f} s, XLA compile {t2 - t1:.1f} s, run {np.median(runs):.2f} s "
          f"(median of 5), loss {float(out[0]):.6f}", flush=True)
  grads = [jax.tree.leaves(results[k][1]) for k in ("unrolled", "scanned")]
  err = max(float(jnp.abs(a - b).max()) for a, b in zip(*grads))
  print(f"largest gradient difference: {err:.2e}; {args.layers} layers, {args.rows} x {args.length} tokens, "
        f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
