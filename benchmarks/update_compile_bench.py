#!/usr/bin/env python
"""XLA compile time of the GRPO update: how a skipped non-finite update keeps the old state.

  .venv/bin/python benchmarks/update_compile_bench.py                  # SmolLM2-135M's shape, random weights
  .venv/bin/python benchmarks/update_compile_bench.py --layers 8       # smaller

`train_step` (grpo_jax/train/step.py) keeps the parameters and optimizer state of an update whose loss, gradient
or result is not finite. Two ways to write that select, compared on the same update:
  cond       `keep_if`: one `lax.cond` on the flag over the whole (params, opt_state) pytree (grpo_jax's)
  per_leaf   the baseline: `jnp.where(flag, new, old)` for each leaf (what the update used to do)
Both compute the same values (checked: parameters after 4 updates bitwise equal). Shapes of
experiments/smollm2_arithmetic.py: 64 rows of 48 prompt + 48 completion tokens, micro-batches of 16, groups of 8
sharing their prompt's forward, AdamW with clipping, beta 0. Prints per variant the XLA compile time (after
tracing and lowering, timed apart) and the median of 3 updates after the first, then the compile-time ratio.
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.algo.objective import LossConfig
from grpo_jax.model.config import ModelConfig
from grpo_jax.model.transformer import Transformer
from grpo_jax.train import step as step_lib
from grpo_jax.settings import OptimSettings
from grpo_jax.train.optim import learning_rate_schedule, make_optimizer


def keep_if_per_leaf(flag, new, old):
  return jax.tree.map(lambda n, o: jnp.where(flag, n, o), new, old)


VARIANTS = {"cond": step_lib.keep_if, "per_leaf": keep_if_per_leaf}


def rollout_batch(rng, rows: int, prompt_len: int, completion_len: int, group: int, vocab: int):
  prompts = np.repeat(rng.integers(0, vocab, (rows // group, prompt_len)), group, axis=0)
  return step_lib.RolloutBatch(
      jnp.asarray(prompts, jnp.int32), jnp.ones((rows, prompt_len), jnp.int32),
      jnp.asarray(rng.integers(0, vocab, (rows, completion_len)), jnp.int32),
      jnp.ones((rows, completion_len), jnp.int32), jnp.asarray(rng.normal(size=rows), jnp.float32),
      jnp.zeros((rows, completion_len), jnp.float32), None)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", type=int, default=30)
  parser.add_argument("--micro", type=int, default=16)
  args = parser.parse_args(argv)
  cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=args.layers, num_heads=9,
                    num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  optim = OptimSettings(learning_rate=1e-5, schedule="constant", grad_clip_norm=1.0)
  optimizer = make_optimizer(optim, learning_rate_schedule(optim, 10, 1))
  batch = rollout_batch(np.random.default_rng(0), 64, 48, 48, 8, cfg.vocab_size)
  results, compile_s = {}, {}
  for name, keep_if in VARIANTS.items():
    step_lib.keep_if = keep_if   # read by train_step when it is traced
    try:
      fn = jax.jit(step_lib.make_train_step(
          graphdef, optimizer, LossConfig(beta=0.0), num_iterations=1, mini_batch_size=64,
          micro_batch_size=args.micro, temperature=0.8, chunk_size=64, prompt_repeats=8), donate_argnums=(0, 1))
      p, o = jax.tree.map(jnp.copy, params), optimizer.init(params)
      t0 = time.perf_counter()
      lowered = fn.lower(p, o, batch)
      t1 = time.perf_counter()
      compiled = lowered.compile()
      t2 = time.perf_counter()
    finally:
      step_lib.keep_if = VARIANTS["cond"]
    runs = []
    for _ in range(4):
      t = time.perf_counter()
      p, o, metrics = compiled(p, o, batch)
      jax.block_until_ready(metrics)
      runs.append(time.perf_counter() - t)
    results[name], compile_s[name] = jax.tree.leaves(p), t2 - t1
    print(f"{name}: trace+lower {t1 - t0:.1f} s, XLA compile {t2 - t1:.1f} s, update {np.median(runs[1:]):.2f} s "
          f"(median of 3 after the first), loss {float(metrics['loss']):.6f}", flush=True)
  equal = all(np.array_equal(a, b) for a, b in zip(results["cond"], results["per_leaf"]))
  print(f"compile time per_leaf / cond: {compile_s['per_leaf'] / compile_s['cond']:.2f}x; parameters after 4 "
        f"updates bitwise equal: {equal}; {args.layers} layers, load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
