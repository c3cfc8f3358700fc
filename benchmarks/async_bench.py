"""Overlapped rollouts against inline ones on this machine's CPU, and benchmarks/async_sim.py's model checked
against the measurement.

  python benchmarks/async_bench.py [--config experiments/default.py] [--steps 30] [--set KEY=VALUE ...]

Three launches of scripts/train.py with `rollout.staleness` = 1 (the same batches, the same learning):
  inline       the baseline: one CPU device on all cores, sampling then updating;
  overlapped   two virtual CPU devices (XLA's host device count), the sampler on one (`rollout.sampler_devices`
               = 1), the update on the other, at once;
  inline_1core the inline run pinned to one core (taskset): each side's phase times if each owned one core.
Prints the median step time of each (steps 3 onward), the ratio overlapped / inline, and async_sim's two
predictions of the overlapped step with their errors:
  owned devices  from the one-core phases: other + reference + max(update, copy + sample + reward), the premise
                 of accelerators, where each side has its own devices;
  shared pool    from the two-core phases of `inline`: their sum, plus the copy. XLA's virtual CPU devices share
                 one intra-op thread pool (`--xla_cpu_multi_thread_eigen=false` does not change that in jax 0.10: a
                 2048^2 matmul took 138 ms with and without it, 258 ms pinned to one core), so this is the premise that
                 holds here, and the check of the model on a CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import async_sim  # python benchmarks/async_bench.py: this folder is sys.path[0]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PHASES = ("timing/sample_s", "timing/reward_s", "timing/reference_s", "timing/update_s", "timing/other_s")


def launch(workdir: str, config: str, steps: int, overrides: list[str], devices: int = 1,
           cores: str | None = None) -> list[dict]:
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
             PYTHONPATH=ROOT)
  argv = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config", config, "--workdir", workdir,
          "--config.rollout.staleness=1", f"--config.num_steps={steps}", "--config.eval.every=100000",
          f"--config.checkpoint.every={steps}", "--config.log.plot=False", "--config.log.tensorboard=False",
          "--config.log.progress_bar=False", *[f"--config.{o}" for o in overrides]]
  if devices > 1:
    argv.append("--config.rollout.sampler_devices=1")
  if cores is not None:
    argv = ["taskset", "-c", cores, *argv]
  done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
  if done.returncode:
    raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r.get("step", 0) >= 3 and "step_time" in r]


def median(rows: list[dict], key: str) -> float:
  return statistics.median(float(r.get(key, 0.0)) for r in rows)


def phases(rows: list[dict], devices: int) -> async_sim.Phases:
  """The median phase seconds of a run's steps."""
  sample, reward, reference, update, other = (median(rows, key) for key in PHASES)
  return async_sim.Phases(sample, reward, reference, update, devices=devices, other=other)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="experiments/default.py")
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--set", action="append", default=[], help="a config override KEY=VALUE (repeatable)")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    runs = {}
    for name, kwargs in (("inline", {}), ("overlapped", {"devices": 2}), ("inline_1core", {"cores": "0"})):
      runs[name] = launch(os.path.join(tmp, name), args.config, args.steps, args.set, **kwargs)
  steps = {name: median(rows, "step_time") for name, rows in runs.items()}
  one, two = phases(runs["inline_1core"], 1), phases(runs["inline"], 2)
  # the weight copy to the sampler's device, as the overlapped run measured it (timing/sync_s)
  copy_s = median(runs["overlapped"], "timing/sync_s")
  owned = async_sim.overlapped_step(one, devices=2, sampler_devices=1, transfer_s=copy_s)
  shared = async_sim.shared_pool_step(two, transfer_s=copy_s)
  print(f"{args.config}, {args.steps} steps, staleness 1, overrides {args.set}; median step seconds (steps 3+):")
  for name, seconds in steps.items():
    print(f"  {name:<13} {seconds:.4f} s")
  for cores, p in (("2 cores", two), ("1 core", one)):
    print(f"  phases, inline ({cores}):".ljust(28) + ", ".join(f"{k} {v:.4f}" for k, v in p._asdict().items()
                                                             if k != "devices"))
  print(f"overlapped / inline (baseline `inline`): {steps['inline'] / steps['overlapped']:.2f}x the speed; the "
        f"overlapped run's weight copy (timing/sync_s, counted by both predictions): {copy_s * 1e3:.2f} ms")
  for premise, predicted in (("owned devices, 1-core phases", owned), ("shared pool, 2-core phases", shared)):
    print(f"model (async_sim, {premise}): {predicted:.4f} s predicted against {steps['overlapped']:.4f} s "
          f"measured ({100 * (predicted / steps['overlapped'] - 1):+.1f}%)")


if __name__ == "__main__":
  main()
