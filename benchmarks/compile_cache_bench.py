#!/usr/bin/env python
"""Compilation on a resume, with and without the persistent compilation cache (`config.compile_cache_dir`).

  python benchmarks/compile_cache_bench.py                                          # experiments/default.py
  python benchmarks/compile_cache_bench.py --config experiments/smollm2_arithmetic.py   # needs models/SmolLM2...

Three launches of scripts/train.py, each a fresh process:
  1. a new run for one step, with an empty cache directory (everything compiles: the "cold" launch);
  2. its resume for one more step with that cache (the "cached" launch);
  3. the same resume from a copy of the step-1 workdir with the cache off (`compile_cache_dir=""`): the baseline.
For each, the seconds XLA spent compiling (jax's '/jax/core/compile/backend_compile_duration' events), the
seconds spent loading programs from the cache, and the launch's wall time. The ratio is baseline / cached
compilation. Nothing else should run meanwhile.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs scripts/train.py in this process, summing jax's compile and cache-load durations, printed as JSON at exit.
_LAUNCH = """
import atexit, json, runpy, sys, time
import jax.monitoring as monitoring
totals = {"compile_s": 0.0, "cache_load_s": 0.0, "compiles": 0, "cache_loads": 0}
t0 = time.time()
def listen(event, duration, **kwargs):
  if event == "/jax/core/compile/backend_compile_duration":
    totals["compile_s"] += duration; totals["compiles"] += 1
  elif event == "/jax/compilation_cache/cache_retrieval_time_sec":
    totals["cache_load_s"] += duration; totals["cache_loads"] += 1
monitoring.register_event_duration_secs_listener(listen)
atexit.register(lambda: print("COMPILE_TOTALS " + json.dumps(dict(totals, wall_s=time.time() - t0))))
sys.argv = ["scripts/train.py"] + sys.argv[1:]
runpy.run_path("scripts/train.py", run_name="__main__")
"""


def launch(config: str, workdir: str, steps: int, cache_dir: str, extra: list[str]) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  cmd = [sys.executable, "-c", _LAUNCH, "--config", config, "--workdir", workdir, f"--config.num_steps={steps}",
         f"--config.compile_cache_dir={cache_dir}", "--config.log.progress_bar=False", *extra]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  lines = [line for line in proc.stdout.splitlines() if line.startswith("COMPILE_TOTALS ")]
  if proc.returncode != 0 or not lines:
    raise RuntimeError(f"launch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return json.loads(lines[-1].split(" ", 1)[1])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default="experiments/default.py")
  p.add_argument("--set", action="append", default=[], help="extra --config.x=y flags for every launch")
  args = p.parse_args(argv)
  tmp = tempfile.mkdtemp(prefix="compile_cache_bench-")
  try:
    cache, run, copy = (os.path.join(tmp, name) for name in ("xla", "run", "run_nocache"))
    rows = {"cold (new run, empty cache)": launch(args.config, run, 1, cache, args.set)}
    shutil.copytree(run, copy)
    rows["cached (resume)"] = launch(args.config, run, 2, cache, args.set)
    rows["baseline (resume, no cache)"] = launch(args.config, copy, 2, "", args.set)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  print(f"{args.config}, load average {os.getloadavg()[0]:.2f}")
  print("| launch | compiled programs | compile s | loaded from cache | load s | wall s |\n|---|---|---|---|---|---|")
  for name, r in rows.items():
    print(f"| {name} | {r['compiles']} | {r['compile_s']:.1f} | {r['cache_loads']} | {r['cache_load_s']:.1f} | "
          f"{r['wall_s']:.1f} |")
  cached, base = rows["cached (resume)"], rows["baseline (resume, no cache)"]
  print(f"compilation on resume: {base['compile_s']:.1f} s without the cache, {cached['compile_s']:.1f} s "
        f"(+ {cached['cache_load_s']:.1f} s loading) with it: "
        f"{base['compile_s'] / max(cached['compile_s'] + cached['cache_load_s'], 1e-9):.1f}x less")
  return 0


if __name__ == "__main__":
  sys.exit(main())
