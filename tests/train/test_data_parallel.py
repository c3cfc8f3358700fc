"""The same launcher and update run data-parallel on a mesh of 2 (virtual CPU) devices."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from tests.train.conftest import ROOT
from tests.virtual_devices import env_with_devices


def test_two_device_data_parallel_run(tmp_path):
  workdir = tmp_path / "dp"
  env = env_with_devices(2)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the config's directory (one set in the environment would win)
  cache = tmp_path / "xla_cache"
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config",
       os.path.join(ROOT, "experiments", "default.py:test"), "--config.mesh.data=2", "--config.num_steps=2",
       "--config.warmstart.enabled=False", "--config.log.plot=False", "--config.log.tensorboard=False",
       "--config.grpo.micro_batch_size=8", f"--config.compile_cache_dir={cache}", "--workdir", str(workdir)],
      capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert list(cache.iterdir()), "the launcher wrote no compiled program to config.compile_cache_dir"
  records = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in records] == [0, 1, 2]
  for r in records[1:]:
    assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 or r["frac_reward_zero_std"] == 1.0
    assert r["logp_mismatch"] < 1e-3
