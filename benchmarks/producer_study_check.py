"""benchmarks/async_sim.py's model of a step's sampling against a measured study of the producer's decodes
(experiments/producer_smollm2.py: static, continuous batching, continuous + rollouts that span updates).

  python benchmarks/producer_study_check.py runs/producer_smollm2 [--config experiments/producer_smollm2.py]

1. Costs, on the config's model (its real weights) at the shapes a step runs, with the stop ids removed so that
   every row runs to its budget (a call's length is then known): `Sampler.generate` with keyed rows (the
   producer's call with a decode budget; the unkeyed one differs by its uniforms' table only), medians of
   `--repeats` calls. The first segment (R prompts x G rows, each prompt prefilled once) with budgets 1 (its
   prefill alone) and 1 + n: the static decode's step over the B rows is the difference over n; the same with
   `sampling.slots` = S gives a slot step, over B x n / S steps. A continued segment of r rows with q tokens so
   far, budget 1: a prefill of its rows' contexts, fit as fixed + per padded token. The slot step is fit as fixed
   + per slot from S slots and S / 2.
2. Lengths: each measured step's completion lengths are not logged one by one; they are modelled from its
   completions/{min,max,mean}_length and clipped_ratio as a lognormal's quantiles (`modelled_lengths`: a
   long tail, as reasoning completions have), in a fixed random order.
3. Prediction: async_sim.segments of those lengths with the member's slots, decode budget and staleness (a
   budgeted step runs one segment of each batch in flight: their seconds add up), against its timing/sample_s,
   step by step from step 2 (step 1 compiles); and the step, its measured other parts (update, rewards,
   evaluation, ...) plus the predicted sampling, against its step_time. Printed per member (medians over its
   steps) and per variant (means over its members), with the errors.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import statistics

import numpy as np

import async_sim  # python benchmarks/producer_study_check.py: this folder is sys.path[0]


def measure_costs(config: str, repeats: int, slots: int, decode_steps: int = 16) -> dict:
  """{name: median seconds} of the calls in the module docstring (1.), with `slots` and `slots` / 2 for the slot
  step, and the shapes and buckets."""
  import jax
  from grpo_jax.sampling.buckets import bucket_size
  from grpo_jax.sampling.sampler import Sampler
  from grpo_jax.settings import Settings
  from grpo_jax.sweep.spec import load_module
  from grpo_jax.train import build, partial
  from grpo_jax.train.producer import make_meshes
  from grpo_jax.train.rollout import RolloutSpec, encode_prompts

  settings = Settings.from_config(load_module(config).get_config(None))
  tokenizer, task = build.build_tokenizer_and_task(settings, log=lambda *_: None)
  graphdef, params = build.build_model(settings, tokenizer, make_meshes(settings)[0])
  base = build.make_samplers(graphdef, settings, tokenizer)[0]
  never_stops = lambda s: Sampler(graphdef, dataclasses.replace(base.cfg, stop_ids=(), slots=s),
                                  prompt_widths=base.prompt_widths)
  static, slotted, half = never_stops(0), never_stops(slots), never_stops(slots // 2)
  spec = RolloutSpec.from_settings(settings, build.build_reward_fns(settings))
  g = settings.grpo
  columns = task.train_rows(0, g.prompts_per_step)
  B, C = g.prompts_per_step * g.group_size, settings.sampling.max_new_tokens
  start = (1, 0, columns, partial.row_key_data(jax.random.key(0), B))

  def timed(sampler, batch, budget) -> float:
    call = lambda: partial.segment(sampler, params, tokenizer, spec, batch, 0, budget, start)[1]
    call()  # compiles
    return statistics.median(call() for _ in range(repeats))

  n = decode_steps
  costs = {"first_prefill": timed(static, None, 1), "static_first": timed(static, None, 1 + n),
           "slots_first_prefill": timed(slotted, None, 1), "slots_first": timed(slotted, None, 1 + n)}
  begun, _ = partial.segment(static, params, tokenizer, spec, None, 0, 1, start)
  prefix = C // 2
  for rows in (slots // 2, slots, B // 2, B):
    batch = begun._replace(tokens_BxC=np.where(np.arange(C) < prefix, begun.tokens_BxC[:, :1], 0).astype(np.int32),
                           lengths_B=np.full(B, prefix, np.int32), done_B=np.arange(B) >= rows)
    costs[f"continued_prefill_{rows}"] = timed(slotted, batch, 1)
    if rows == slots // 2:  # half the slots: a second point of the slot step
      costs["half_slots"] = timed(half, batch, 1 + n)
      costs["half_slots_prefill"] = timed(half, batch, 1)
  prompt = max(len(p) for p in encode_prompts(tokenizer, list(columns["prompt"]), spec.max_prompt_length))
  width = lambda w: base.shapes_for(1, w, beyond_widths=True)[1]
  costs["shapes"] = dict(rows=B, group=g.group_size, max_new_tokens=C, every=base.stop_check_every, slots=slots,
                         prompt=prompt, prefix=prefix, decode_steps=n)
  costs["bucket"] = lambda r: bucket_size(r, 1, base.batch_bucket_step)
  costs["width"] = width
  return costs


def fit(costs: dict) -> tuple[async_sim.Decode, async_sim.Decode, async_sim.Prefill]:
  """(the static decode's step, the slot step: fixed + per slot, a continued segment's prefill: fixed + per
  padded token) from `measure_costs`."""
  s = costs["shapes"]
  n, B, S = s["decode_steps"], s["rows"], s["slots"]
  every = s["every"]
  static_step = (costs["static_first"] - costs["first_prefill"]) / n
  # S slots run B rows of n steps each: B x n / S steps (n a multiple of `every`: no slot idles)
  full = (costs["slots_first"] - costs["slots_first_prefill"]) / (B * n / S)
  half = (costs["half_slots"] - costs["half_slots_prefill"]) / (math.ceil(n / every) * every)
  per_slot = (full - half) / (S - S // 2)
  prefills = [(costs["bucket"](r) * costs["width"](s["prompt"] + s["prefix"]), costs[f"continued_prefill_{r}"])
              for r in (S // 2, S, B // 2, B)]
  per_token, fixed = np.polyfit(*zip(*prefills), 1)
  return (async_sim.Decode(static_step, 0.0), async_sim.Decode(full - per_slot * S, per_slot),
          async_sim.Prefill(float(fixed), float(per_token)))


def modelled_lengths(row: dict, rows: int, max_new_tokens: int) -> np.ndarray:
  """[rows] lengths with a step's logged min, max, mean and clipped ratio (module docstring, 2.): the quantiles
  (i + 1/2) / rows of a lognormal, rounded up and clipped to [min, max_new_tokens], whose share at
  max_new_tokens is the clipped ratio (none clipped: its top quantile is the logged max) and whose sigma gives
  the logged mean (searched on a grid)."""
  normal = statistics.NormalDist()
  z = np.array([normal.inv_cdf((i + 0.5) / rows) for i in range(rows)])
  clipped, low, C = row["completions/clipped_ratio"], row["completions/min_length"], max_new_tokens
  # quantile `level` at `top`: above C - 1 a length rounds up to C (clipped); none clipped, the top one is the max
  top, level = (C - 1, 1 - clipped) if clipped > 0 else (row["completions/max_length"], 1 - 0.5 / rows)
  level = min(max(level, 0.5 / rows), 1 - 0.5 / rows)

  def lengths(sigma):
    mu = math.log(top) - sigma * normal.inv_cdf(level)
    return np.clip(np.ceil(np.exp(mu + sigma * z) - 1e-6), low, C).astype(np.int64)

  sigma = min(np.linspace(0.01, 3.0, 300), key=lambda s: abs(lengths(s).mean() - row["completions/mean_length"]))
  return np.random.default_rng(0).permutation(lengths(sigma))


def predicted_sample_s(lengths, overrides: dict, costs: dict, static: async_sim.Decode, slot: async_sim.Decode,
                       prefill: async_sim.Prefill) -> float:
  s = costs["shapes"]
  slots = overrides.get("sampling.slots", 0)
  budget = overrides.get("rollout.decode_budget", 0)
  first = costs["slots_first_prefill"] if slots else costs["first_prefill"]
  segs = async_sim.segments(lengths, budget, overrides.get("rollout.staleness", 0), slot if slots else static,
                            prefill, prompt_tokens=s["prompt"], group=s["group"], slots=slots, every=s["every"],
                            max_new_tokens=s["max_new_tokens"], row_bucket=costs["bucket"],
                            width_bucket=costs["width"], first_prefill_s=first)
  return sum(seg.seconds for seg in segs)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("sweep_dir")
  parser.add_argument("--config", default="experiments/producer_smollm2.py")
  parser.add_argument("--repeats", type=int, default=5, help="timed calls per shape")
  args = parser.parse_args(argv)
  from grpo_jax.sweep.spec import load_sweep
  members = load_sweep(args.config)
  costs = measure_costs(args.config, args.repeats, max(m.overrides.get("sampling.slots", 0) for m in members))
  static, slot, prefill = fit(costs)
  s = costs["shapes"]
  print(f"costs ({args.config}, stop ids removed; medians of {args.repeats} calls, s): " + ", ".join(
      f"{k} {v:.3f}" for k, v in costs.items() if isinstance(v, float)))
  print(f"fit: static step {static.fixed_s * 1e3:.1f} ms ({s['rows']} rows); slot step {slot.fixed_s * 1e3:.1f} ms "
        f"+ {slot.per_row_s * 1e3:.2f} ms x slots; continued prefill {prefill.fixed_s * 1e3:.1f} ms + "
        f"{prefill.per_token_s * 1e6:.1f} us x tokens; shapes {s}")
  by_variant: dict[str, list[tuple[float, ...]]] = {}
  print(f"{'member':<22} {'steps':>5} {'sample_s':>9} {'predicted':>9} {'error':>7} {'step_time':>9} {'predicted':>9} "
        f"{'error':>7}")
  for member in members:
    path = os.path.join(args.sweep_dir, member.name, "metrics.jsonl")
    if not glob.glob(path):
      print(f"{member.name:<22} (no metrics.jsonl: skipped)")
      continue
    rows = [json.loads(line) for line in open(path)]
    rows = [r for r in rows if r.get("step", 0) >= 2 and "timing/sample_s" in r and "completions/min_length" in r]
    measured = [r["timing/sample_s"] for r in rows]
    predicted = [predicted_sample_s(modelled_lengths(r, s["rows"], s["max_new_tokens"]), member.overrides, costs,
                                    static, slot, prefill) for r in rows]
    # the step: its measured parts besides sampling, plus the sampling predicted
    steps = [r["step_time"] for r in rows]
    step_predicted = [t - m + p for t, m, p in zip(steps, measured, predicted)]
    figures = tuple(statistics.median(x) for x in (measured, predicted, steps, step_predicted))
    by_variant.setdefault(member.group, []).append(figures)
    print(f"{member.name:<22} {len(rows):>5} {_row(*figures)}")
  print(f"{'variant (mean of members)':<28} {'sample_s':>9} {'predicted':>9} {'error':>7} {'step_time':>9} "
        f"{'predicted':>9} {'error':>7}")
  for variant, members in by_variant.items():
    print(f"{variant:<28} {_row(*(statistics.mean(x) for x in zip(*members)))}")


def _row(sample_s, sample_predicted, step_s, step_predicted) -> str:
  error = lambda p, m: f"{100 * (p / m - 1):+6.1f}%"
  return (f"{sample_s:9.2f} {sample_predicted:9.2f} {error(sample_predicted, sample_s)} {step_s:9.2f} "
          f"{step_predicted:9.2f} {error(step_predicted, step_s)}")


if __name__ == "__main__":
  main()
