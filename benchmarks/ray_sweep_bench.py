"""The Ray backend against the local backend, measured in one run.

  .venv/bin/python benchmarks/ray_sweep_bench.py [--members 8] [--dispatch_members 8]

1. Dispatch overhead. `--dispatch_members` members whose trainer only writes its files (tests/sweep/fake_train.py,
   one step, no JAX) run through the local backend (the baseline) and through the Ray backend one at a time;
   the overhead per member is (Ray - local) / members, with and without Ray's start-up and shutdown (timed apart:
   `ray.init` + `ray.shutdown` of a local instance).
2. Throughput. A study of `--members` tiny members (experiments/default.py:test, seeds 0..N-1, the real trainer)
   through the local backend (one after another: the baseline), Ray with {"CPU": 2} per member (one at a time)
   and Ray with {"CPU": 1} per member (two at once on this 2-core machine); the speed-up is local / Ray.
The members' final metrics are checked equal across the three (timings aside), so the speed-up is for the same
results.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from grpo_jax.sweep import spec, study  # noqa: E402

FAKE_TRAIN = [sys.executable, os.path.join(REPO, "tests", "sweep", "fake_train.py")]
TINY = "experiments/default.py:test"
COMMON = {"log.plot": False, "log.tensorboard": False}


def _quiet(*_):
  pass


def _timed_sweep(members, sweep_dir, **kwargs) -> float:
  t0 = time.perf_counter()
  outcomes = study.run_sweep(kwargs.pop("config_spec", TINY), sweep_dir, members=members, echo=_quiet,
                             check_keys=False, **kwargs)
  wall = time.perf_counter() - t0
  bad = {k: v for k, v in outcomes.items() if v != "done"}
  if bad:
    raise SystemExit(f"members did not finish: {bad} (see {sweep_dir})")
  return wall


def _final_metrics(sweep_dir: str, name: str) -> dict:
  with open(os.path.join(sweep_dir, name, "metrics.jsonl")) as f:
    last = [json.loads(line) for line in f][-1]
  return {k: v for k, v in last.items() if not (k.startswith("timing/") or k in ("step_time", "tokens_per_s"))}


def ray_start_stop_s() -> float:
  import ray
  t0 = time.perf_counter()
  ray.init(address="local", num_cpus=2, log_to_driver=False)
  ray.shutdown()
  return time.perf_counter() - t0


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--members", type=int, default=8, help="tiny real members in the throughput study")
  parser.add_argument("--dispatch_members", type=int, default=8, help="no-op members in the dispatch study")
  args = parser.parse_args(argv)
  print(f"[bench] load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
  ray_init = {"num_cpus": 2}
  with tempfile.TemporaryDirectory() as tmp:
    noop = spec.validate([{"name": f"noop{i}", "overrides": {"num_steps": 1}}
                          for i in range(args.dispatch_members)])
    local = _timed_sweep(noop, os.path.join(tmp, "noop_local"), backend="local", train_cmd=FAKE_TRAIN,
                         config_spec="noop.py")
    ray_wall = _timed_sweep(noop, os.path.join(tmp, "noop_ray"), backend="ray", train_cmd=FAKE_TRAIN,
                            config_spec="noop.py", member_resources={"CPU": 2}, ray_init_kwargs=ray_init)
    start_stop = ray_start_stop_s()
    n = args.dispatch_members
    print(f"[dispatch] {n} no-op members: local {local:.2f} s, Ray one at a time {ray_wall:.2f} s "
          f"(Ray start + shutdown alone: {start_stop:.2f} s)")
    print(f"[dispatch] overhead per member: {(ray_wall - local) / n:.3f} s with start-up, "
          f"{(ray_wall - start_stop - local) / n:.3f} s without; ratio Ray/local {ray_wall / local:.2f}")

    tiny = spec.validate([{"name": f"m{i}", "overrides": {"seed": i}} for i in range(args.members)])
    walls = {}
    walls["local, 1 at a time"] = _timed_sweep(tiny, os.path.join(tmp, "local"), backend="local", common=COMMON)
    walls["Ray, 1 at a time"] = _timed_sweep(tiny, os.path.join(tmp, "ray1"), backend="ray", common=COMMON,
                                             member_resources={"CPU": 2}, ray_init_kwargs=ray_init)
    walls["Ray, 2 at once"] = _timed_sweep(tiny, os.path.join(tmp, "ray2"), backend="ray", common=COMMON,
                                           member_resources={"CPU": 1}, ray_init_kwargs=ray_init)
    for m in tiny:
      a, b, c = (_final_metrics(os.path.join(tmp, d), m.name) for d in ("local", "ray1", "ray2"))
      if not a == b == c:
        raise SystemExit(f"{m.name}: final metrics differ between backends")
    base = walls["local, 1 at a time"]
    print(f"[study] {args.members} members of {TINY} (final metrics equal on all three):")
    for label, wall in walls.items():
      print(f"  {label:<20} {wall:7.1f} s   {wall / args.members:5.2f} s/member   speed-up vs local {base / wall:.2f}x")
    print(f"[study] 2 at once vs 1 at a time on Ray: {walls['Ray, 1 at a time'] / walls['Ray, 2 at once']:.2f}x")
  print(f"[bench] load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
