#!/usr/bin/env python
"""SIGTERM to a training run, as a spot VM's reclaim sends it: seconds to exit, steps lost, restart cost.

  python benchmarks/preemption_bench.py --workdir /tmp/pre_default -- --config experiments/default.py
  python benchmarks/preemption_bench.py --workdir /tmp/pre_smollm2 --signals 2 --fractions 0.3,0.8 -- \\
      --config experiments/gsm8k.py:smollm2 --config.num_steps=4 --config.eval.every=100 --config.eval.size=8

Starts `scripts/train.py ARGS --workdir WORKDIR`; once a step after the first is logged (compiled, steady), waits
FRACTION of the last step time and sends SIGTERM, then measures how long the trainer takes to exit, and reads
the newest checkpoint and metrics.jsonl: steps lost = the last step logged minus the step saved (0 means the
last completed step was saved). It then starts the same command again (the resume) and measures the seconds
until its first new step is logged: the restart overhead of one preemption (start-up, compile, restore). One
signal per fraction; the last resume runs to the end unless --stop_after_last. Baseline: the run's own step
time, measured in the same run (the table prints exit seconds as a ratio of it).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from grpo_jax.errors import EXIT_PREEMPTED  # noqa: E402


def _rows(workdir: str) -> list[dict]:
  rows = []
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      for line in f:
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:
          pass
  except FileNotFoundError:
    pass
  return rows


def _steps(workdir: str) -> list[dict]:
  return [r for r in _rows(workdir) if "event" not in r]


def _saved_step(workdir: str) -> int | None:
  directory = os.path.join(workdir, "checkpoints")
  steps = [int(d) for d in os.listdir(directory) if d.isdigit()] if os.path.isdir(directory) else []
  return max(steps) if steps else None


def _wait_for_step(proc, workdir: str, after: int, timeout_s: float) -> dict | None:
  """The first logged step row past `after`, or None if the process ended first."""
  end = time.time() + timeout_s
  while time.time() < end and proc.poll() is None:
    rows = [r for r in _steps(workdir) if r["step"] > after]
    if rows:
      return rows[0]
    time.sleep(0.02)
  return None


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True)
  p.add_argument("--fractions", default="0.1,0.5,0.9", help="when in a step each SIGTERM lands (of a step time)")
  p.add_argument("--signals", type=int, default=0, help="signals (default: one per fraction)")
  p.add_argument("--steps_between", type=int, default=1, help="new steps logged after a resume before the next")
  p.add_argument("--stop_after_last", action="store_true", help="do not run the last resume to the end")
  p.add_argument("train_args", nargs="+", help="after --: scripts/train.py's arguments, less --workdir")
  args = p.parse_args(argv)
  fractions = [float(f) for f in args.fractions.split(",")]
  n = args.signals or len(fractions)
  cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), *args.train_args, "--workdir", args.workdir]
  log = open(os.path.join(os.path.dirname(os.path.abspath(args.workdir)) or ".",
                          os.path.basename(args.workdir.rstrip("/")) + ".bench.log"), "a")
  results = []
  for i in range(n):
    launch = time.time()
    before = max([r["step"] for r in _steps(args.workdir)], default=-1)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    first = _wait_for_step(proc, args.workdir, max(before, 0), 3600)  # the first new step (0 -> 1 when fresh)
    if first is None:
      sys.exit(f"preemption_bench: the run ended before logging a step past {before} (log: {log.name})")
    restart_s = time.time() - launch if before >= 1 else None
    row = _wait_for_step(proc, args.workdir, first["step"] + args.steps_between - 1, 3600) \
        if args.steps_between > 1 else first
    if row is None:
      sys.exit(f"preemption_bench: the run ended early (log: {log.name})")
    step_s = row["step_time"]
    time.sleep(fractions[i % len(fractions)] * step_s)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait()
    exit_s = time.time() - t0
    last = max(r["step"] for r in _steps(args.workdir))
    saved = _saved_step(args.workdir)
    results.append(dict(fraction=fractions[i % len(fractions)], step_s=step_s, exit_s=exit_s, rc=rc, last=last,
                        saved=saved, restart_s=restart_s))
  if not args.stop_after_last:
    launch = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    before = max(r["step"] for r in _steps(args.workdir))
    first = _wait_for_step(proc, args.workdir, before, 3600)
    results[-1]["final_restart_s"] = None if first is None else time.time() - launch
    proc.wait()
  print("| SIGTERM at (of a step) | step s | rc | SIGTERM -> exit s | exit / step | last logged | saved | steps lost |"
        " restart to next step s |")
  print("|---|---|---|---|---|---|---|---|---|")
  restarts = [r["restart_s"] for r in results[1:]] + [results[-1].get("final_restart_s")]
  for r, restart in zip(results, restarts):
    ok = "" if r["rc"] == EXIT_PREEMPTED else " (not the preempted code!)"
    print(f"| {r['fraction']:.1f} | {r['step_s']:.2f} | {r['rc']}{ok} | {r['exit_s']:.2f} | "
          f"{r['exit_s'] / r['step_s']:.2f} | {r['last']} | {r['saved']} | {r['last'] - r['saved']} | "
          + ("-" if restart is None else f"{restart:.1f}") + " |")
  print(f"(log: {log.name})")


if __name__ == "__main__":
  main()
