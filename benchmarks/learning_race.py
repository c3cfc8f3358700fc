#!/usr/bin/env python
"""Launch to held-out accuracy: grpo_jax, TRL's GRPOTrainer and Tunix's GRPOLearner trained on one experiment,
one after the other, each scored by grpo_jax's greedy evaluator on the same held-out prompts.

  .venv/bin/pip install "trl==1.16.0" -c constraints.txt && bash benchmarks/setup_tunix.sh   # once
  .venv/bin/python benchmarks/learning_race.py --out runs/race --steps 10 --eval-every 5
  .venv/bin/python benchmarks/learning_race.py --out runs/race --report --figure docs/figures/learning_race.png

The experiment (default experiments/smollm2_arithmetic.py: SmolLM2-135M-Instruct, "What is 37 + 45?", 8 prompts
x G 8, 48 new tokens, beta 0, lr 1e-5) is run as written by each side:
  grpo_jax  scripts/train.py, evaluating every `--eval-every` steps itself (metrics `timing/eval_s`)
  trl       benchmarks/trl_learning.py's GRPOTrainer run (its setting map), a snapshot every E steps
  tunix     benchmarks/tunix_grpo.py (its setting map and pitfalls), a snapshot every E steps
TRL's and Tunix's snapshots are saved off their clocks and evaluated after training by grpo_jax's evaluator, on
the prompts and with the max_new_tokens of the grpo_jax run's `eval/accuracy`.

The clock of a point is the seconds from the side's process launch (Linux /proc) to the end of that step's
update, less the time the side spent evaluating (grpo_jax) or saving snapshots (TRL, Tunix): interpreter,
imports, loading, compilation, the steps and grpo_jax's checkpoints count, evaluation does not, since two of the
three sides are evaluated after the fact. grpo_jax's own evaluation seconds are reported beside. The threshold
is the first evaluated step at or above step 0's accuracy + `--points`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("grpo_jax", "trl", "tunix")
LABELS = {"grpo_jax": "grpo_jax", "trl": "TRL GRPOTrainer 1.16", "tunix": "Tunix GRPOLearner 0.1.7"}


def run_grpo_jax(args, out: str) -> None:
  subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config", args.config,
                  "--workdir", out, f"--config.num_steps={args.steps}", f"--config.seed={args.seed}",
                  f"--config.eval.every={args.eval_every}", f"--config.checkpoint.every={args.eval_every}"],
                 cwd=ROOT, check=True)


def run_trl(args, out: str) -> None:
  subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "trl_learning.py"), "--config", args.config,
                  "--out", out, "--steps", str(args.steps), "--eval-every", str(args.eval_every),
                  "--seed", str(args.seed)], cwd=ROOT, check=True)


def run_tunix(args, out: str) -> None:
  from step_bench import TUNIX_PYTHON, train_rows
  from trl_learning import evaluate_snapshots, load_experiment
  from tunix_grpo import make_spec
  config = load_experiment(args.config)
  config.seed = args.seed
  spec = make_spec(config, train_rows(config, config.grpo.prompts_per_step * args.steps), args.steps)
  spec.update(snapshot_every=args.eval_every, snapshot_dir=os.path.join(out, "snapshots"))
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "spec.json"), "w") as f:
    json.dump(spec, f)
  records = os.path.join(out, "records.json")
  subprocess.run([TUNIX_PYTHON, "-m", "benchmarks.tunix_grpo", "--spec",
                  os.path.join(out, "spec.json"), "--out", records], cwd=ROOT, check=True)
  with open(records) as f:
    steps = json.load(f)["steps"]
  evaluate_snapshots(out, config, {r["step"]: r for r in steps})


def curve(side: str, out: str) -> dict:
  """{"points": [(clock_s, accuracy, step)], "eval_s": grpo_jax's evaluation seconds, "first_step_s": ...}."""
  from grpo_jax.persist.metrics import read_jsonl
  rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
  points, eval_s = [], 0.0
  if side == "grpo_jax":
    for r in rows:
      if r["step"] > 0 and "eval/accuracy" in r:
        points.append((r["timing/since_launch_s"] - eval_s, r["eval/accuracy"], r["step"]))
      eval_s += r.get("timing/eval_s", 0.0)
    with open(os.path.join(out, "summary.json")) as f:
      first = json.load(f)["launch_to_first_step_s"] - rows[0].get("timing/eval_s", 0.0)
  else:
    points = [(r["since_launch_s"], r["eval/accuracy"], r["step"]) for r in rows if r["step"] > 0]
    with open(os.path.join(out, "train_log.jsonl" if side == "trl" else "records.json")) as f:
      log = [json.loads(x) for x in f] if side == "trl" else json.load(f)["steps"]
    first = log[0]["since_launch_s"]
  start = [r["eval/accuracy"] for r in rows if r["step"] == 0][0]
  return {"points": [(0.0, start, 0)] + points, "eval_s": eval_s, "first_step_s": first}


def report(args) -> None:
  curves = {s: curve(s, os.path.join(args.out, s)) for s in SIDES if os.path.exists(os.path.join(args.out, s,
                                                                                                   "metrics.jsonl"))}
  print(f"{args.out}: held-out greedy accuracy by seconds since launch (evaluation time excluded); threshold: "
        f"step 0 + {args.points:g} points")
  print("| | launch to first step (s) | launch to threshold (s) | at step | accuracy by step |\n|---|---|---|---|---|")
  reached = {}
  for side, c in curves.items():
    start = c["points"][0][1]
    hit = next(((t, k) for t, a, k in c["points"][1:] if a >= start + args.points / 100), None)
    reached[side] = hit[0] if hit else None
    accs = ", ".join(f"{k}: {100 * a:.1f}%" for _, a, k in c["points"])
    print(f"| {LABELS[side]} | {c['first_step_s']:.0f} | {'not reached' if not hit else f'{hit[0]:.0f}'} | "
          f"{hit[1] if hit else '-'} | {accs} |")
  if reached.get("grpo_jax"):
    for side in ("trl", "tunix"):
      if reached.get(side):
        print(f"launch to threshold: grpo_jax {reached[side] / reached['grpo_jax']:.2f}x faster than {LABELS[side]}")
  if "grpo_jax" in curves:
    print(f"grpo_jax's own evaluations took {curves['grpo_jax']['eval_s']:.0f} s (not in the clock above)")
  if args.figure:
    from trl_learning import draw
    start = next(iter(curves.values()))["points"][0][1]
    draw([(LABELS[side], [t / 60 for t, _, _ in c["points"]], [100 * a for _, a, _ in c["points"]])
          for side, c in curves.items()], "minutes since launch, evaluation excluded (2-core CPU)", args.title,
         args.figure, hline=(100 * start + args.points, f"threshold (+{args.points:g} points)"))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=os.path.join(ROOT, "experiments", "smollm2_arithmetic.py"))
  parser.add_argument("--out", default="runs/race")
  parser.add_argument("--sides", default=",".join(SIDES))
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--eval-every", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--points", type=float, default=30.0, help="the threshold: step 0's accuracy + this")
  parser.add_argument("--report", action="store_true", help="only report (and plot) the runs in --out")
  parser.add_argument("--figure", default=None)
  parser.add_argument("--title", default="SmolLM2-135M-Instruct, sums in English (seed 0)")
  args = parser.parse_args(argv)
  args.out = os.path.abspath(args.out)
  if not args.report:
    for side in args.sides.split(","):
      {"grpo_jax": run_grpo_jax, "trl": run_trl, "tunix": run_tunix}[side](args, os.path.join(args.out, side))
  report(args)


if __name__ == "__main__":
  main()
