#!/usr/bin/env python
"""What redrawing curves.png after each evaluation costs a run (`config.log.plot`, plotting.CurvesRefresher).

  python benchmarks/curves_refresh_bench.py              # experiments/default.py, 3 pairs of runs
  python benchmarks/curves_refresh_bench.py --pairs 5 --config experiments/default.py

Each pair is two fresh processes of scripts/train.py on the same config, in alternating order:
  baseline   the figure drawn once, at the end (CurvesRefresher.after_eval a no-op): what a run did before;
  refreshed  the figure also redrawn after evaluations by the idle-priority helper process.
For each run, the wall time of its process (summary.json's wall_s_this_process) and, for the refreshed one, how
many drawings of curves.png it made while it trained (the file's modification time, polled every 0.1 s, counted
once it holds for a poll). The ratio is the median of refreshed / baseline over the pairs. Nothing else should
run meanwhile: on 2 cores another process moves a 60 s run by +-8%.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# scripts/train.py in this process, with the refresher switched off when asked.
_LAUNCH = """
import runpy, sys
if sys.argv[1] == "baseline":
  from grpo_jax.train import plotting
  plotting.CurvesRefresher.after_eval = lambda self: None
sys.argv = ["scripts/train.py"] + sys.argv[2:]
runpy.run_path("scripts/train.py", run_name="__main__")
"""


def one_run(kind: str, config: str, workdir: str) -> dict:
  """Runs `config` to its end in a fresh process; returns its wall seconds and the redraws seen while it ran."""
  shutil.rmtree(workdir, ignore_errors=True)
  png = os.path.join(workdir, "curves.png")
  process = subprocess.Popen([sys.executable, "-c", _LAUNCH, kind, "--config", config, "--workdir", workdir,
                              "--config.log.progress_bar=False"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  seen, counted, previous = 0, None, None
  while process.poll() is None:
    if os.path.exists(os.path.join(workdir, "summary.json")):  # the end's own drawing is not a refresh
      break
    mtime = os.stat(png).st_mtime_ns if os.path.exists(png) else None
    if mtime is not None and mtime == previous != counted:  # unchanged for a poll: one finished drawing
      seen, counted = seen + 1, mtime
    previous = mtime
    time.sleep(0.1)
  _, err = process.communicate()
  if process.returncode != 0:
    raise SystemExit(f"{kind} run failed (exit {process.returncode}):\n{err[-3000:]}")
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  return {"kind": kind, "wall_s": summary["wall_s_this_process"], "redraws_while_training": seen,
          "time_split_s": summary["time_split_s"]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="experiments/default.py")
  parser.add_argument("--pairs", type=int, default=3)
  parser.add_argument("--json", help="also write the runs and the ratio here")
  args = parser.parse_args()
  scratch = tempfile.mkdtemp(prefix="curves_bench_")
  runs = []
  try:
    for i in range(args.pairs):
      order = ("baseline", "refreshed") if i % 2 == 0 else ("refreshed", "baseline")
      pair = {kind: one_run(kind, args.config, os.path.join(scratch, kind)) for kind in order}
      runs.append(pair)
      print(f"pair {i + 1}: baseline {pair['baseline']['wall_s']:.1f} s, refreshed {pair['refreshed']['wall_s']:.1f} s"
            f" ({pair['refreshed']['redraws_while_training']} redraws while training)", flush=True)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  ratio = statistics.median(p["refreshed"]["wall_s"] / p["baseline"]["wall_s"] for p in runs)
  parts = runs[0]["baseline"]["time_split_s"]
  print("where the time went, mean of the pairs (s): " + ", ".join(
      f"{part} {statistics.mean(p['baseline']['time_split_s'][part] for p in runs):.1f} -> "
      f"{statistics.mean(p['refreshed']['time_split_s'][part] for p in runs):.1f}" for part in parts))
  print(f"{args.config}: refreshed / baseline wall time = {ratio:.3f} (median of {args.pairs} pairs; the issue's "
        f"bound: 1.02)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"config": args.config, "pairs": runs, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
  main()
