#!/usr/bin/env python
"""Continuous batching (`sampling.slots`) against the static decode on a long tail of completion lengths: decode
tokens/s of both, the static decode's slot utilization and the ratio, in one run.

  .venv/bin/python benchmarks/continuous_batching_bench.py
  .venv/bin/python benchmarks/continuous_batching_bench.py --prompts 16 --group 4 --slots 16 --new-tokens 384

A random model (D=128, 4 layers, 4 query heads of 32 and 2 KV heads, MLP 256, vocabulary 1024, float32) whose
logits are near uniform, sampled at temperature 1 with --stop-ids stop ids: each token stops its row with
probability ~stop-ids / 1024, so lengths are geometric (mean ~1024 / stop-ids, from 1 token to hundreds; rows that
reach --new-tokens are cut there). --prompts prompts of 32 tokens, --group completions each (B rows). The static
decode runs all B rows until the last one stops; the continuous one keeps --slots rows busy. Both give the same
completions (checked), so tokens/s is kept tokens over the wall time of `Sampler.generate`, timed after one
compiling call, alternately, medians of --repeats.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import async_sim  # run as a script (or by gpu_campaign.py): this folder is sys.path[0]


def measure(*, prompts: int, group: int, slots: int, new_tokens: int, stop_ids: int, repeats: int,
            prompt: int = 32, step_factor: float = 1.0) -> dict:
  """{"static" / "continuous": {"seconds", "tokens_per_s", "utilization"}, "tokens", "lengths", "ratio"}."""
  import jax
  import numpy as np
  from flax import nnx

  from grpo_jax.model import ModelConfig, Transformer
  from grpo_jax.sampling import Sampler, SamplingConfig

  cfg = ModelConfig(vocab_size=1024, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=32, max_position_embeddings=4096)
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  prompt_ids = [list(map(int, rng.integers(1, 1024, size=prompt))) for _ in range(prompts)]
  static_cfg = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, pad_id=0,
                              stop_ids=tuple(range(1, 1 + stop_ids)))
  samplers = {"static": Sampler(graphdef, static_cfg, prompt_bucket_min=prompt),
              "continuous": Sampler(graphdef, dataclasses.replace(static_cfg, slots=slots), prompt_bucket_min=prompt)}
  key = jax.random.key(0)
  results = {name: s.generate(state, prompt_ids, key, repeats=group) for name, s in samplers.items()}  # compile
  for field in ("completion_BxC", "completion_mask_BxC"):
    assert np.array_equal(getattr(results["static"], field), getattr(results["continuous"], field)), field
  times = {name: [] for name in samplers}
  for _ in range(repeats):
    for name, s in samplers.items():
      t = time.perf_counter()
      s.generate(state, prompt_ids, key, repeats=group)
      times[name].append(time.perf_counter() - t)
  lengths = results["static"].lengths_B
  # Every call decodes the same rows: the counters' totals give each call's utilization.
  out = {name: {"seconds": statistics.median(ts), "tokens_per_s": int(lengths.sum()) / statistics.median(ts),
                "utilization": samplers[name].kept_slot_steps / samplers[name].slot_steps}
         for name, ts in times.items()}
  out.update(tokens=int(lengths.sum()), lengths=lengths,
             ratio=out["continuous"]["tokens_per_s"] / out["static"]["tokens_per_s"])
  # async_sim's model of the continuous decode: the list-scheduling makespan of these lengths over the slots
  # (refilled every stop_check_every steps) times a token step of `slots` rows, timed here as a static decode of
  # that many rows (its seconds over its steps, the prefill amortized in them), times `step_factor`: what a
  # continuous step costs more (refills, per-row cache writes), measured by an earlier run (measured_factor).
  static = samplers["static"]
  few = prompt_ids[:max(1, slots // group)]
  static.generate(state, few, key, repeats=group)  # compile
  step_times = []
  for _ in range(repeats):
    t = time.perf_counter()
    static.generate(state, few, key, repeats=group)
    step_times.append((time.perf_counter() - t) / static.last_num_steps)
  step_s = statistics.median(step_times)
  steps = async_sim.makespan(lengths, slots, static.stop_check_every)
  predicted = steps * step_s * step_factor
  out["model"] = {"step_s_at_slots": step_s, "predicted_s": predicted, "step_factor": step_factor,
                  "error": predicted / out["continuous"]["seconds"] - 1,
                  "measured_factor": out["continuous"]["seconds"] / (steps * step_s)}
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--group", type=int, default=4)
  parser.add_argument("--slots", type=int, default=16)
  parser.add_argument("--new-tokens", type=int, default=384)
  parser.add_argument("--stop-ids", type=int, default=16, help="stop ids among the 1024 tokens (mean length ~1024/n)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--step-factor", type=float, default=1.0,
                      help="async_sim's cost of a continuous token step over a static one of as many rows")
  args = parser.parse_args(argv)
  import jax
  import numpy as np
  r = measure(prompts=args.prompts, group=args.group, slots=args.slots, new_tokens=args.new_tokens,
              stop_ids=args.stop_ids, repeats=args.repeats, step_factor=args.step_factor)
  lengths = r["lengths"]
  print(f"{len(lengths)} rows ({args.prompts} prompts x {args.group}), {args.slots} slots, 32 prompt tokens, "
        f"max {args.new_tokens} new; {jax.devices()[0].platform}, jax {jax.__version__}")
  print(f"  lengths: min {lengths.min()}, median {int(np.median(lengths))}, mean {lengths.mean():.0f}, "
        f"90th {int(np.percentile(lengths, 90))}, max {lengths.max()}; {r['tokens']:,} tokens")
  for name in ("static", "continuous"):
    print(f"  {name:10s} {r[name]['tokens_per_s']:9,.0f} tokens/s  {r[name]['seconds']:6.2f} s  slot utilization "
          f"{r[name]['utilization']:.0%}")
  print(f"  continuous / static: {r['ratio']:.2f}x")
  m = r["model"]
  print(f"  async_sim's continuous decode: makespan over {args.slots} slots x {m['step_s_at_slots'] * 1e3:.2f} ms a "
        f"static step of {args.slots} rows x {m['step_factor']:g} = {m['predicted_s']:.2f} s predicted, "
        f"{r['continuous']['seconds']:.2f} s measured ({100 * m['error']:+.1f}%); a continuous step costs "
        f"{m['measured_factor']:.2f}x a static one here")


if __name__ == "__main__":
  main()
