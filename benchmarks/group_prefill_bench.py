#!/usr/bin/env python
"""What sharing a group's prefill and bucketing prompt widths buy the trainer's sampler.

  .venv/bin/python benchmarks/group_prefill_bench.py                  # tiny random Qwen2 (test fixture)
  .venv/bin/python benchmarks/group_prefill_bench.py --model smollm2  # SmolLM2-135M-Instruct (scripts/get_smollm2.sh)

R GSM8K prompts (rendered by the GSM8K recipe's task: chat template and system prompt) are sampled G times
each, `--new-tokens` tokens per completion (no stop ids, so every variant decodes the same tokens), float32,
three ways, timed alternately (`--repeats` calls each after one warm-up call that compiles):

  baseline   the trainer before: R x G rows, each prompt repeated G times, padded to max_prompt_length
  shared     one prefill per prompt (`generate(..., repeats=G)`), still padded to max_prompt_length
  bucketed   the trainer now: shared, and padded to the smallest of grpo.length_buckets widths that holds
             the longest prompt (`rollout.bucket_widths`)

Prints the median seconds per call and the speed-up over the baseline, and how many of the R x G rows the
baseline and shared sample identically from the same key: the random numbers are the same, the prefill's
logits differ by float rounding (a batch of R rows instead of R x G), which now and then moves a draw that
sat on a boundary, and the row continues differently from there (SmolLM2: 31 of 32 rows, first log-prob
difference 2e-5).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
  parser.add_argument("--prompts", type=int, default=4, help="R")
  parser.add_argument("--group", type=int, default=8, help="G")
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--max-prompt-length", type=int, default=256)
  parser.add_argument("--length-buckets", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)

  import jax
  from flax import nnx

  from grpo_jax.data.tasks import make_task
  from grpo_jax.settings import Settings
  from grpo_jax.model.hf_io import from_pretrained
  from grpo_jax.sampling import Sampler, SamplingConfig
  from grpo_jax.train.rollout import bucket_widths, encode_prompts
  from trl_learning import load_experiment

  config = load_experiment(os.path.join(ROOT, "experiments", "gsm8k.py"),
                           "smollm2" if args.model == "smollm2" else "test")
  if args.model == "smollm2" and not os.path.isdir(config.model.hf_path):
    sys.exit("models/SmolLM2-135M-Instruct is missing: bash scripts/get_smollm2.sh")
  task = make_task(Settings.from_config(config), log=lambda _: None)
  texts = task.train_rows(0, args.prompts)["prompt"]
  prompts = encode_prompts(task.tokenizer, texts, args.max_prompt_length)
  G = args.group
  graphdef, state = nnx.split(from_pretrained(config.model.hf_path, dtype="float32", param_dtype="float32"))
  cfg = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0, pad_id=task.tokenizer.pad_token_id)
  full = Sampler(graphdef, cfg, prompt_widths=(args.max_prompt_length,))
  bucketed = Sampler(graphdef, cfg, prompt_widths=bucket_widths(args.max_prompt_length, args.length_buckets))
  variants = {
      "baseline": lambda key: full.generate(state, [p for p in prompts for _ in range(G)], key),
      "shared": lambda key: full.generate(state, prompts, key, repeats=G),
      "bucketed": lambda key: bucketed.generate(state, prompts, key, repeats=G),
  }
  key = jax.random.key(0)
  first = {name: fn(key) for name, fn in variants.items()}  # compiles
  same_rows = int(np.all(first["baseline"].completion_BxC == first["shared"].completion_BxC, axis=1).sum())
  times = {name: [] for name in variants}
  for i in range(args.repeats):
    for name, fn in variants.items():
      t0 = time.perf_counter()
      fn(jax.random.fold_in(key, i + 1))
      times[name].append(time.perf_counter() - t0)
  lengths = [len(p) for p in prompts]
  print(f"{args.model}: R={args.prompts} prompts ({min(lengths)}-{max(lengths)} tokens) x G={G}, "
        f"{args.new_tokens} new tokens, max_prompt_length {args.max_prompt_length}, widths "
        f"{bucket_widths(args.max_prompt_length, args.length_buckets)}; median of {args.repeats} calls; "
        f"load average {os.getloadavg()[0]:.2f}; rows sampled identically by baseline and shared: "
        f"{same_rows}/{len(prompts) * G}")
  base = float(np.median(times["baseline"]))
  print("| variant | seconds per call | speed-up over baseline |\n|---|---|---|")
  for name, ts in times.items():
    print(f"| {name} | {np.median(ts):.3f} | {base / np.median(ts):.2f}x |")


if __name__ == "__main__":
  main()
