#!/usr/bin/env python
"""One GRPO step (sampling, reference log-probs, update), grpo_jax against TRL's GRPOTrainer and Tunix's
GRPOLearner, on the same checkpoint, prompts and sizes, in one invocation.

  .venv/bin/pip install "trl==1.16.0" -c constraints.txt       # once; TRL is not a dependency
  bash benchmarks/setup_tunix.sh                               # once; Tunix gets its own ./.venv-tunix
  .venv/bin/python benchmarks/step_bench.py --model smollm2    # SmolLM2-135M-Instruct (bash scripts/get_smollm2.sh)
  .venv/bin/python benchmarks/step_bench.py --sides grpo_jax,trl   # tiny random Qwen2 (the recipes' fixture)

`--task arithmetic` takes experiments/smollm2_arithmetic.py instead ("What is 37 + 45?", 8 prompts x G 8, 48
new tokens, micro-batches of 16), where SmolLM2's reward climbs within 10 steps, so the sides' reward curves
can be compared as well as their speed; beta is 0.04 there too unless `--beta`. By default every
side takes the GSM8K recipe (experiments/gsm8k.py; preset `test` for the tiny model, `smollm2` for
SmolLM2 on the vendored GSM8K prompts) with the sizes given here (default: 4 prompts x G 8, 64 new tokens,
beta 0.04 with the reference model, micro-batches of 8, no remat: `--remat 1` for the recipe's) and float32
compute on a CPU (`--dtype`). The settings map to TRL's names as in benchmarks/trl_learning.py; TRL gets the
prompt texts that grpo_jax renders (chat template and system prompt), as plain strings, and grpo_jax's
reward. Tunix gets the same through benchmarks/tunix_grpo.py (its docstring has the mapping and the three
Tunix pitfalls it works around); it maps Llama checkpoints only, so not the tiny Qwen2.

Each side runs in its own process, one after the other, for `--steps` steps (default 6). A step's time is
the wall time from its start to the end of its update (grpo_jax: `step_time` in metrics.jsonl; TRL: a
callback's on_step_begin to on_step_end; Tunix: the end of one global step to the end of the next, the first
from the start of `train`); the table gives the median of steps 2..N, so the first step's
compilation (grpo_jax) and warm-up (both) are left out. Steps that meet a new prompt or completion width
compile again in grpo_jax (at most `grpo.length_buckets` widths per side), which the median keeps out as well
when it is a minority of steps; the per-step figures are printed too. grpo_jax's split comes from its
`timing/*` metrics (sampling, rewards, reference, update, the rest). "launch to first step" is each
process's start (Linux /proc) to the end of its first step: imports, loading, compilation and one step.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (experiment file, preset) per --task and --model, and the sizes a flag left unset takes.
EXPERIMENTS = {("gsm8k", "tiny"): ("gsm8k.py", "test"), ("gsm8k", "smollm2"): ("gsm8k.py", "smollm2"),
               ("arithmetic", "tiny"): ("smollm2_arithmetic.py", "test"),
               ("arithmetic", "smollm2"): ("smollm2_arithmetic.py", None)}
SIZES = {"gsm8k": dict(prompts=4, group=8, micro_batch=8, new_tokens=64, max_prompt_length=256, beta=0.04),
         "arithmetic": dict(beta=0.04)}  # arithmetic: the experiment's 8 prompts x G 8, micro 16, 48 + 48 tokens
SIZE_KEYS = {"prompts": ("grpo", "prompts_per_step"), "group": ("grpo", "group_size"),  # flag -> config key
             "micro_batch": ("grpo", "micro_batch_size"), "beta": ("grpo", "beta"),
             "new_tokens": ("sampling", "max_new_tokens"), "max_prompt_length": ("sampling", "max_prompt_length")}
PHASES = ("sample", "reward", "reference", "update", "other")
SIDES = ("grpo_jax", "grpo_jax_per_row", "trl", "tunix")
TUNIX_PYTHON = os.path.join(ROOT, ".venv-tunix", "bin", "python")


def bench_config(args):
  from trl_learning import load_experiment
  name, preset = EXPERIMENTS[args.task, args.model]
  c = load_experiment(os.path.join(ROOT, "experiments", name), preset)
  c.seed = args.seed
  c.num_steps = args.steps
  sizes = {**SIZES[args.task], **{k: v for k, v in vars(args).items() if k in SIZE_KEYS and v is not None}}
  for key, value in sizes.items():
    section, name = SIZE_KEYS[key]
    setattr(getattr(c, section), name, value)
  c.model.dtype = args.dtype
  c.optim.warmup_steps = 0
  c.model.share_prompt_forward = args.side != "grpo_jax_per_row"
  c.model.remat = bool(args.remat)
  c.eval.every = 10_000        # the step-0 and final evaluations only, outside the timed steps
  c.eval.size = c.eval.batch_size = 4
  c.checkpoint.every = 10_000
  c.log.every = 1
  c.log.samples_every = 10_000
  c.log.progress_bar = c.log.tensorboard = c.log.plot = False
  return c


def run_grpo_jax(args) -> dict:
  from grpo_jax.train.loop import train
  from grpo_jax.persist.metrics import read_jsonl
  workdir = os.path.join(args.out, args.side)
  config = bench_config(args)
  summary = train(config, workdir)
  reward = f"rewards/{config.eval.accuracy_reward}/mean"
  return {"launch_to_first_step_s": summary.launch_to_first_step_s,
          "steps": [{"step": r["step"], "seconds": r["step_time"], "completion_length": r["completions/mean_length"],
                     "reward": r[reward], **{f"t_{p}": r.get(f"timing/{p}_s", 0.0) for p in PHASES}}
                    for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["step"] >= 1]}


def train_rows(config, n: int) -> dict:
  """The first `n` training prompts as grpo_jax renders them, with their answers."""
  from grpo_jax.data.tasks import make_task
  from grpo_jax.settings import Settings
  return make_task(Settings.from_config(config), log=lambda _: None).train_rows(0, n)


def run_tunix(args) -> dict:
  """benchmarks/tunix_grpo.py in ./.venv-tunix on the spec of this config."""
  from tunix_grpo import make_spec
  config = bench_config(args)
  spec = make_spec(config, train_rows(config, config.grpo.prompts_per_step * (args.steps + 1)), args.steps)
  spec_path, out = os.path.join(args.out, "tunix_spec.json"), os.path.join(args.out, "tunix_records.json")
  with open(spec_path, "w") as f:
    json.dump(spec, f)
  subprocess.run([TUNIX_PYTHON, "-m", "benchmarks.tunix_grpo", "--spec", spec_path,
                  "--out", out], cwd=ROOT, check=True)
  with open(out) as f:
    record = json.load(f)
  # After the timed run: both models must compute the same function of the first prompt.
  reference, checked = os.path.join(args.out, "grpo_jax_logits.npz"), os.path.join(args.out, "tunix_parity.json")
  np.savez(reference, **grpo_jax_logits(config, spec["rows"]["prompt"][0]))
  subprocess.run([TUNIX_PYTHON, "-m", "benchmarks.tunix_grpo", "--spec", spec_path,
                  "--out", checked, "--parity", reference], cwd=ROOT, check=True)
  with open(checked) as f:
    record["parity"] = json.load(f)
  return record


def grpo_jax_logits(config, prompt: str) -> dict:
  """grpo_jax's float32 logits of `prompt` (one row, no padding): tokens_1xT, logits_1xTxV."""
  from grpo_jax.sampling.text import encode_text
  from grpo_jax.model import hf_io
  from grpo_jax.model.logprobs import causal_attention_mask, positions_from_mask
  tokens = np.asarray([encode_text(hf_io.load_tokenizer(config.model.hf_path), prompt)], np.int32)
  mask = np.ones_like(tokens, bool)
  model = hf_io.from_pretrained(config.model.hf_path, param_dtype="float32", dtype="float32")
  hidden, _ = model(tokens, positions_from_mask(mask), causal_attention_mask(mask))
  return {"tokens_1xT": tokens, "logits_1xTxV": np.asarray(model.logits(hidden), np.float64)}


def run_trl(args) -> dict:
  return trl_step_records(bench_config(args), args.steps, args.out, args.dtype, args.seed)


def trl_step_records(config, steps: int, out: str, dtype: str, seed: int, device: str = "cpu") -> dict:
  """TRL's GRPOTrainer for `steps` steps of `config` (model.hf_path, the task's first training prompts): each
  step's seconds (a callback's on_step_begin to on_step_end), completion length and reward."""
  import torch
  from datasets import Dataset
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  from grpo_jax.rewards.registry import get_reward
  from grpo_jax.train.timing import seconds_since_launch
  from trl_learning import logs_by_step, trl_arguments

  rows = train_rows(config, config.grpo.prompts_per_step * (steps + 1))
  dataset = Dataset.from_dict(rows)
  accuracy = get_reward(config.eval.accuracy_reward)

  def gsm8k_accuracy(prompts, completions, answer, **_):
    return [float(x) for x in accuracy(list(prompts), list(completions), answer=list(answer))]

  torch.manual_seed(seed)
  torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
  model = AutoModelForCausalLM.from_pretrained(config.model.hf_path, dtype=torch_dtype)
  records, first_step = [], {}

  class Clock(TrainerCallback):
    def on_step_begin(self, a, state, control, **kw):
      self.t0 = time.perf_counter()

    def on_step_end(self, a, state, control, **kw):
      if device != "cpu":
        torch.cuda.synchronize()
      records.append({"step": state.global_step, "seconds": time.perf_counter() - self.t0})
      first_step.setdefault("launch", seconds_since_launch())

  trl_args = trl_arguments(config, os.path.join(out, "trl"), steps)
  trl_args.update(bf16=dtype == "bfloat16", use_cpu=device == "cpu")
  trainer = GRPOTrainer(model=model, reward_funcs=[gsm8k_accuracy], train_dataset=dataset,
                        processing_class=AutoTokenizer.from_pretrained(config.model.hf_path),
                        callbacks=[Clock()], args=GRPOConfig(**trl_args))
  trainer.train()
  logs = logs_by_step(trainer)
  for r in records:
    log = logs.get(r["step"], {})
    r["completion_length"] = log.get("completions/mean_length", float("nan"))
    r["reward"] = log.get("rewards/gsm8k_accuracy/mean", float("nan"))
  return {"steps": records, "launch_to_first_step_s": first_step.get("launch")}


def median_after_first(records: list[dict], key: str) -> float:
  values = [r[key] for r in records if r["step"] >= 2]
  return float(np.median(values)) if values else float("nan")


def spread_after_first(records: list[dict], key: str) -> str:
  values = [r[key] for r in records if r["step"] >= 2]
  return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


LABELS = {"grpo_jax": "grpo_jax", "grpo_jax_per_row": "grpo_jax, each row its own prompt forward",
          "trl": "TRL GRPOTrainer", "tunix": "Tunix GRPOLearner"}


def missing_side(side: str) -> str | None:
  """Why `side` cannot run here, with the fix, or None."""
  if side == "trl":
    try:
      import trl  # noqa: F401
    except ImportError:
      return '--sides has trl, which is not installed: .venv/bin/pip install "trl==1.16.0" -c constraints.txt'
  if side == "tunix" and not os.path.exists(TUNIX_PYTHON):
    return "--sides has tunix, whose environment is missing: bash benchmarks/setup_tunix.sh"
  return None


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
  parser.add_argument("--task", choices=sorted(SIZES), default="gsm8k",
                      help="gsm8k: experiments/gsm8k.py's prompts; arithmetic: experiments/smollm2_arithmetic.py")
  parser.add_argument("--sides", default="grpo_jax,trl,tunix",
                      help=f"comma-separated, run in this order; from {', '.join(SIDES)}")
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--prompts", type=int)
  parser.add_argument("--group", type=int)
  parser.add_argument("--micro-batch", type=int)
  parser.add_argument("--new-tokens", type=int)
  parser.add_argument("--max-prompt-length", type=int)
  parser.add_argument("--beta", type=float)
  parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--remat", type=int, choices=(0, 1), default=0,
                      help="recompute the forward in the backward pass (TRL: gradient_checkpointing); Tunix: 0 only")
  parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # child processes
  parser.add_argument("--out", help="where the runs and their step records go (default: a temporary dir)")
  args = parser.parse_args(argv)

  if args.side:
    run = {"trl": run_trl, "tunix": run_tunix}.get(args.side, run_grpo_jax)
    with open(os.path.join(args.out, f"{args.side}_steps.json"), "w") as f:
      json.dump(run(args), f)
    return

  sides = [x for x in args.sides.split(",") if x]
  unknown = [x for x in sides if x not in SIDES]
  if unknown or not sides:
    sys.exit(f"--sides: unknown {unknown}; choose from {', '.join(SIDES)}")
  if args.model == "smollm2" and not os.path.isdir(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct")):
    sys.exit("models/SmolLM2-135M-Instruct is missing: bash scripts/get_smollm2.sh")
  if args.model == "tiny" and "tunix" in sides:
    sys.exit("--sides has tunix, which maps Llama checkpoints only: use --model smollm2 or drop tunix")
  for side in sides:
    if why := missing_side(side):
      sys.exit(why)
  out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="step_bench_"))
  os.makedirs(out, exist_ok=True)
  child = [a for a in (argv if argv is not None else sys.argv[1:])]
  results, launch = {}, {}
  for side in sides:
    t0 = time.time()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *child, "--side", side, "--out", out],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
      sys.exit(f"{side} failed:\n{proc.stderr[-4000:]}")
    with open(os.path.join(out, f"{side}_steps.json")) as f:
      record = json.load(f)
    results[side], launch[side] = record["steps"], record["launch_to_first_step_s"]
    print(f"{side}: {len(results[side])} steps in {time.time() - t0:.0f} s (process, set-up included); per step: "
          + " ".join(f"{r['seconds']:.1f}" for r in results[side])
          + "; reward per step: " + " ".join(f"{r['reward']:.2f}" for r in results[side]), flush=True)
    if "parity" in record:
      print("  Tunix's logits against grpo_jax's on the first prompt, max |difference|: "
            + ", ".join(f"{k} {v:.2e}" for k, v in record["parity"].items()), flush=True)

  c = bench_config(args)
  g = c.grpo
  print(f"\n{args.model}, {args.task}: {g.prompts_per_step} prompts x G {g.group_size}, {c.sampling.max_new_tokens} "
        f"new tokens, beta {g.beta}, micro-batch {g.micro_batch_size}, {args.dtype}, remat {args.remat}; "
        f"median (min-max) of steps 2..{args.steps}; "
        f"load average {os.getloadavg()[0]:.2f}")
  base = median_after_first(results[sides[0]], "seconds")
  print(f"| | step (s) | steps 2+ min-max | {sides[0]} speed vs this | launch to first step (s) | "
        "mean completion length | mean reward |\n|---|---|---|---|---|---|---|")
  for side in sides:
    t = median_after_first(results[side], "seconds")
    first = "-" if launch[side] is None else f"{launch[side]:.1f}"
    print(f"| {LABELS[side]} | {t:.2f} | {spread_after_first(results[side], 'seconds')} | {t / base:.2f}x | {first} | "
          f"{median_after_first(results[side], 'completion_length'):.1f} | "
          f"{np.mean([r['reward'] for r in results[side]]):.3f} |")
  for side in ("grpo_jax", "grpo_jax_per_row"):
    if side in results:
      split = ", ".join(f"{p} {median_after_first(results[side], f't_{p}'):.2f}" for p in PHASES)
      print(f"{side} step split (s, medians): {split}")


if __name__ == "__main__":
  main()
