"""Rollouts that span updates (`rollout.decode_budget`) on this CPU: benchmarks/async_sim.py's "segments" model
of the step's sampling against a measured run.

  python benchmarks/segments_bench.py [--config experiments/default.py] [--budgets 1,2,3] [--steps 40]

1. Costs: times `grpo_jax.train.partial.segment` (the producer's own call: one `Sampler.generate` and its host
   bookkeeping) at the shapes a step of the default experiment runs, with a random model of the config's shape:
   a batch's first segment (its G x prompts rows, each group's prompt prefilled once) with budget 1 (the prefill
   alone) and to the end (the prefill, then one chunk of decode steps), and a continued segment of r unfinished
   rows with q tokens so far (their prompt and those prefilled again) for r in 64 .. 256 and q in 1 .. 3, the same
   two ways. From these it fits async_sim's costs (least squares over the medians of `--repeats` calls each): a
   continued segment's prefill, fixed + per padded token (the fixed part: the call's dispatch and host
   bookkeeping), and a decode step, fixed + per row; the first segment's prefill is taken as measured.
2. Runs: scripts/train.py with `rollout.staleness` = 1 and `decode_budget` 0 and each of `--budgets` (as
   async_bench.py's `launch`), each `--steps` steps; the median `timing/sample_s` of steps 3 on.
3. Prediction: the sum of async_sim.segments' seconds for each budgeted run's completion lengths (its median
   completions/mean_length, rows of floor and ceil of it mixed to give that mean: the default task's answers are
   2 or 3 digits and a stop token), with the sampler's row and width buckets and its stop_check_every chunks;
   printed against the measurement. The calibration shapes include those the runs use: what is checked is the
   schedule (which calls a step makes, over how many rows, how many steps each) and that a call costs in the
   trainer what it costs alone.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile

import numpy as np

import async_sim  # python benchmarks/segments_bench.py: this folder is sys.path[0]
from async_bench import launch, median


def measure_costs(config: str, repeats: int = 15) -> dict:
  """{shape: median seconds} of `partial.segment` calls (module docstring, 1.) and the sampler's bucketing."""
  import jax
  from grpo_jax.sampling.buckets import bucket_size
  from grpo_jax.settings import Settings
  from grpo_jax.sweep.spec import load_module
  from grpo_jax.train import build, partial
  from grpo_jax.train.producer import make_meshes
  from grpo_jax.train.rollout import RolloutSpec, encode_prompts

  preset = config.partition(":")[2]
  settings = Settings.from_config(load_module(config).get_config(preset or None))
  tokenizer, task = build.build_tokenizer_and_task(settings, log=lambda *_: None)
  graphdef, params = build.build_model(settings, tokenizer, make_meshes(settings)[0])
  sampler = build.make_samplers(graphdef, settings, tokenizer)[0]
  spec = RolloutSpec.from_settings(settings, build.build_reward_fns(settings))
  g = settings.grpo
  columns = task.train_rows(0, g.prompts_per_step)
  key_data = partial.row_key_data(jax.random.key(0), g.prompts_per_step * g.group_size)
  start = (1, 0, columns, key_data)

  def timed(fn) -> float:
    fn()  # compiles
    return statistics.median(fn() for _ in range(repeats))

  costs = {}
  for budget, name in ((1, "first_prefill"), (None, "first_full")):
    costs[name] = timed(lambda budget=budget: partial.segment(sampler, params, tokenizer, spec, None, 0, budget,
                                                              start)[1])
  begun, _ = partial.segment(sampler, params, tokenizer, spec, None, 0, 1, start)
  B, C = begun.tokens_BxC.shape
  digit = tokenizer.encode("5")[-1]  # the tokens so far: digits (a prefix may not hold a stop id)
  for prefix in (1, 2, 3):
    for rows in sorted({64, 128, 192, B}):
      batch = begun._replace(tokens_BxC=np.tile(np.where(np.arange(C) < prefix, digit, tokenizer.pad_token_id),
                                                (B, 1)).astype(np.int32),
                             lengths_B=np.full(B, prefix, np.int32), done_B=np.arange(B) >= rows)
      for budget, name in ((1, "prefill"), (None, "full"))[:1 if prefix >= C - 1 else 2]:  # one token left: a prefill
        costs[f"continued_{name}_{rows}_{prefix}"] = timed(
            lambda batch=batch, budget=budget: partial.segment(sampler, params, tokenizer, spec, batch, 1,
                                                               budget)[1])
  prompt = max(len(p) for p in encode_prompts(tokenizer, list(columns["prompt"]), spec.max_prompt_length))
  width = lambda w: sampler.shapes_for(1, w, beyond_widths=True)[1]
  costs["shapes"] = dict(rows=B, group=g.group_size, max_new_tokens=settings.sampling.max_new_tokens,
                         every=sampler.stop_check_every, prompt=prompt, widths=[width(prompt + i) for i in range(C)],
                         bucket_step=sampler.batch_bucket_step)
  costs["bucket"] = lambda r: bucket_size(r, 1, sampler.batch_bucket_step)
  costs["width"] = width
  return costs


def fit(costs: dict) -> tuple[async_sim.Prefill, async_sim.Decode]:
  """(a continued segment's prefill: its call's fixed seconds and per padded token, a decode step's cost) from
  `measure_costs`, least squares: the continued prefill-only calls fit fixed + per_token x tokens; the calls to
  the end less those fit chunk x t(rows), the first segment's too."""
  s = costs["shapes"]
  chunk = min(s["every"], s["max_new_tokens"] - 1)  # the decode steps of a call to the end (one chunk here)
  continued = [tuple(map(int, k.split("_")[2:])) for k in costs if k.startswith("continued_prefill_")]
  prefills = [(costs["bucket"](r) * s["widths"][q], costs[f"continued_prefill_{r}_{q}"]) for r, q in continued]
  steps = [(s["rows"], (costs["first_full"] - costs["first_prefill"]) / chunk)]
  steps += [(costs["bucket"](r), (costs[f"continued_full_{r}_{q}"] - costs[f"continued_prefill_{r}_{q}"]) / chunk)
            for r, q in continued if f"continued_full_{r}_{q}" in costs]
  (fixed_s, per_token_s), (step_s, per_row_s) = (np.polyfit(*zip(*points), 1)[::-1] for points in (prefills, steps))
  return async_sim.Prefill(float(fixed_s), float(per_token_s)), async_sim.Decode(float(step_s), float(per_row_s))


def mixed_lengths(mean: float, rows: int) -> np.ndarray:
  """[rows] of floor(mean) and ceil(mean), as many of the longer as give `mean`."""
  low = math.floor(mean)
  longer = round((mean - low) * rows)
  return np.array([low + 1] * longer + [low] * (rows - longer), np.int64)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="experiments/default.py")
  parser.add_argument("--budgets", default="2", help="rollout.decode_budget of the budgeted runs, comma-separated")
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--repeats", type=int, default=15, help="timed calls per shape")
  parser.add_argument("--set", action="append", default=[],
                      help="a config override KEY=VALUE for the runs (repeatable; the costs are timed without)")
  args = parser.parse_args(argv)
  budgets = [int(b) for b in args.budgets.split(",")]
  costs = measure_costs(args.config, args.repeats)
  prefill, decode = fit(costs)
  s = costs["shapes"]
  print(f"segment costs ({args.config}, random weights; medians of {args.repeats} calls, ms; continued_*_R_Q: R "
        f"rows with Q tokens so far):")
  for name, seconds in costs.items():
    if isinstance(seconds, float):
      print(f"  {name:<24} {seconds * 1e3:8.3f}")
  print(f"fit: a continued segment's prefill {prefill.fixed_s * 1e3:.3f} ms + {prefill.per_token_s * 1e6:.3f} us x "
        f"tokens, a decode step {decode.fixed_s * 1e3:.3f} ms + {decode.per_row_s * 1e6:.3f} us x rows; the first "
        f"segment's prefill as measured; shapes {s}")
  runs = {}
  with tempfile.TemporaryDirectory() as tmp:
    for budget in (0, *budgets):
      runs[budget] = launch(os.path.join(tmp, str(budget)), args.config, args.steps,
                            [*args.set, f"rollout.decode_budget={budget}"])
  kwargs = dict(decode=decode, prefill=prefill, prompt_tokens=s["prompt"], group=s["group"], every=s["every"],
                max_new_tokens=s["max_new_tokens"], row_bucket=costs["bucket"], width_bucket=costs["width"],
                first_prefill_s=costs["first_prefill"])
  print(f"\n{args.steps} steps each, staleness 1, overrides {args.set}; decode_budget 0 (the unkeyed sampler, one "
        f"call a batch; not modelled by segment costs): median sample_s {median(runs[0], 'timing/sample_s') * 1e3:.2f}"
        f" ms, step {median(runs[0], 'step_time') * 1e3:.2f} ms")
  table = []
  for budget in budgets:
    mean_length = median(runs[budget], "completions/mean_length")
    lengths = mixed_lengths(mean_length, s["rows"])
    segs = async_sim.segments(lengths, budget, 1, **kwargs)
    predicted, measured = sum(seg.seconds for seg in segs), median(runs[budget], "timing/sample_s")
    table.append((budget, mean_length, measured, predicted, median(runs[budget], "step_time")))
    print(f"decode_budget {budget}: lengths modelled as {np.bincount(lengths).tolist()} rows of 0, 1, ... tokens "
          f"(median completions/mean_length {mean_length:.3f})")
    for seg in segs:
      print(f"  segment {seg.index}: {seg.rows} rows, {seg.prefill_tokens} tokens prefilled, {seg.decode_steps} "
            f"decode steps of {seg.decode_rows} rows: {seg.seconds * 1e3:.2f} ms")
  print(f"{'decode_budget':<14} {'mean length':>11} {'step ms':>8} {'sample_s ms':>12} {'predicted':>10} {'error':>7}")
  for budget, mean_length, measured, predicted, step in table:
    print(f"{budget:<14} {mean_length:11.3f} {step * 1e3:8.2f} {measured * 1e3:12.2f} {predicted * 1e3:10.2f} "
          f"{100 * (predicted / measured - 1):+6.1f}%")


if __name__ == "__main__":
  main()
