#!/usr/bin/env python
"""Qwen3.5's hybrid (three Gated DeltaNet layers to one full-attention layer) against an all-attention model of the
same size: decode tokens/s and sampler cache bytes per row, at 512 and 4,096 new tokens, in one run.

  .venv/bin/python benchmarks/hybrid_decode_bench.py
  .venv/bin/python benchmarks/hybrid_decode_bench.py --rows 8 --new-tokens 512,4096 --repeats 2

Both models: D=256, 8 layers, MLP 512, vocabulary 1024, float32; attention with 8 query heads of 32 and 2 KV heads;
the hybrid's linear layers have 4 query/key heads and 8 value heads of 32 (the published models' 1:2 ratio). The
baseline is the same configuration with every layer full attention. The sampler decodes greedily in segments of 256
steps (each reads only the KV slots filled so far), --rows rows after a 32-token prompt; timed after one compiling
call, alternately, medians of --repeats. Cache bytes: every layer's cache at 32 + new tokens, per row (a full layer
keeps keys and values per slot, a linear layer a convolution window and a [value heads, Dk, Dv] state).
"""
from __future__ import annotations

import argparse
import statistics
import time


def configs(layers: int = 8):
  from grpo_jax.model import ModelConfig
  from grpo_jax.model.config import FULL, LINEAR
  shape = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=layers, num_heads=8,
               num_kv_heads=2, head_dim=32, max_position_embeddings=8192, family="qwen3_5_text", qk_norm=True,
               attention_output_gate=True, partial_rotary_factor=0.25, linear_num_key_heads=4,
               linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32)
  hybrid = tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(layers))
  return {"all attention (baseline)": ModelConfig(layer_types=(FULL,) * layers, **shape),
          "hybrid 3:1": ModelConfig(layer_types=hybrid, **shape)}


def cache_bytes_per_row(cfg, length: int) -> int:
  import jax
  from grpo_jax.model.transformer import init_cache
  cache = jax.eval_shape(lambda: init_cache(cfg, 1, length))
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))


def measure(*, rows: int, new_tokens: tuple[int, ...], repeats: int = 2, prompt: int = 32) -> dict:
  """{new tokens: {model: {"seconds", "tokens_per_s", "ratio" (tokens/s over the baseline's), "cache_bytes"}}}."""
  import jax
  import numpy as np
  from flax import nnx

  from grpo_jax.model import Transformer
  from grpo_jax.sampling import Sampler, SamplingConfig

  models = configs()
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, 1024, size=prompt)) for _ in range(rows)]
  out = {}
  for C in new_tokens:
    runs = {}
    for name, cfg in models.items():
      graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
      sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=C, greedy=True, pad_id=0, decode_segment=256),
                        prompt_bucket_min=prompt)
      runs[name] = (lambda s=sampler, st=state: jax.block_until_ready(
          s.generate(st, prompts, jax.random.key(0)).completion_BxC), sampler)
    for run, sampler in runs.values():
      run()  # compile
      assert sampler.last_num_steps == C, "every row must decode all its tokens"
    times = {name: [] for name in runs}
    for _ in range(repeats):
      for name, (run, _) in runs.items():
        t = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - t)
    rate = {name: rows * C / statistics.median(ts) for name, ts in times.items()}
    base = rate["all attention (baseline)"]
    out[C] = {name: {"seconds": statistics.median(times[name]), "tokens_per_s": rate[name],
                     "ratio": rate[name] / base, "cache_bytes": cache_bytes_per_row(models[name], prompt + C)}
              for name in runs}
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, default=8)
  parser.add_argument("--new-tokens", default="512,4096", help="comma-separated completion lengths")
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args(argv)
  import jax
  result = measure(rows=args.rows, new_tokens=tuple(int(n) for n in args.new_tokens.split(",")),
                   repeats=args.repeats)
  print(f"{args.rows} rows, 32 prompt tokens, greedy; {jax.devices()[0].platform}, jax {jax.__version__}")
  for C, models in result.items():
    base_bytes = models["all attention (baseline)"]["cache_bytes"]
    for name, r in models.items():
      print(f"  {C:5d} new tokens  {name:24s} {r['tokens_per_s']:9,.0f} tokens/s ({r['ratio']:.2f}x)  cache "
            f"{r['cache_bytes'] / 2**20:7.2f} MiB/row ({r['cache_bytes'] / base_bytes:.2f}x)")


if __name__ == "__main__":
  main()
