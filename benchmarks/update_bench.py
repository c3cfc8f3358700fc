#!/usr/bin/env python
"""The GRPO update on a batch cut to its length bucket (grpo.length_buckets) against the full-width update.

  .venv/bin/python benchmarks/update_bench.py                 # SmolLM2-135M-Instruct if fetched, else a tiny model
  .venv/bin/python benchmarks/update_bench.py --answer-tokens 13 --repeats 3

The batch has the shapes of experiments/smollm2_arithmetic.py (64 rows, prompts padded to 48, completions to 48)
with every completion `--answer-tokens` long, as once the policy answers "94 + 63 = 157." The same jitted
update runs on the full 48 + 48 columns (the baseline: what a run with length_buckets=1 does) and on the batch
cut by `trim_padding` (4 buckets: 16 completion columns for answers of 9-16 tokens); both are timed after one
compiling call, alternately, and the medians and their ratio are printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct"))
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--micro", type=int, default=16)
  parser.add_argument("--prompt-tokens", type=int, default=40, help="real prompt tokens (padded to 48)")
  parser.add_argument("--answer-tokens", type=int, default=13)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)

  import jax
  import numpy as np
  import optax
  from flax import nnx

  from grpo_jax.algo.objective import LossConfig
  from grpo_jax.model import ModelConfig, Transformer, hf_io
  from grpo_jax.train.rollout import trim_padding
  from grpo_jax.train.step import RolloutBatch, make_train_step

  P = C = 48
  if os.path.isdir(args.model):
    model, name = hf_io.from_pretrained(args.model), os.path.basename(args.model)
  else:
    cfg = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=64, max_position_embeddings=256)
    model, name = Transformer(cfg, rngs=nnx.Rngs(0)), "tiny random model (6M parameters)"
  graphdef, params = nnx.split(model)
  vocab = model.cfg.vocab_size
  rng = np.random.default_rng(0)
  B = args.rows
  prompt_mask = np.zeros((B, P), np.int32)
  prompt_mask[:, P - args.prompt_tokens:] = 1
  comp_mask = np.zeros((B, C), np.int32)
  comp_mask[:, :args.answer_tokens] = 1
  batch = RolloutBatch(rng.integers(1, vocab, (B, P)).astype(np.int32) * prompt_mask, prompt_mask,
                       rng.integers(1, vocab, (B, C)).astype(np.int32), comp_mask,
                       rng.normal(size=B).astype(np.float32), np.zeros((B, C), np.float32), None)
  cut = trim_padding(batch, buckets=4)
  optimizer = optax.adamw(1e-5)
  step = jax.jit(make_train_step(graphdef, optimizer, LossConfig(beta=0.0, max_completion_length=C),
                                 num_iterations=1, mini_batch_size=B, micro_batch_size=args.micro,
                                 temperature=0.8, chunk_size=64))
  opt_state = optimizer.init(params)

  def timed(b):
    start = time.perf_counter()
    jax.block_until_ready(step(params, opt_state, b))
    return time.perf_counter() - start

  compile_full, compile_cut = timed(batch), timed(cut)
  full, trimmed = [], []
  for _ in range(args.repeats):
    full.append(timed(batch))
    trimmed.append(timed(cut))
  f, t = statistics.median(full), statistics.median(trimmed)
  print(f"{name}: update of {B} rows, {args.prompt_tokens}-token prompts, {args.answer_tokens}-token answers; "
        f"load average {os.getloadavg()[0]:.2f}")
  print(f"  full width   {P} + {C} columns: {f:.2f} s (first call with compilation {compile_full:.1f} s)")
  print(f"  length bucket {cut.prompt_BxP.shape[1]} + {cut.completion_BxC.shape[1]} columns: {t:.2f} s "
        f"(first call {compile_cut:.1f} s)")
  print(f"  ratio full / bucket: {f / t:.2f}x")


if __name__ == "__main__":
  main()
