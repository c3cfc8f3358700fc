#!/usr/bin/env python
"""Seconds per GRPO step with the workdir on local disk, on S3 (moto's server) and on GCS (fake-gcs-server).

  python -m benchmarks.store_overhead_bench                 # 20 steps of experiments/default.py:test, 3 rounds
  python -m benchmarks.store_overhead_bench --steps 40 --every 5 --rounds 3

Each launch is a fresh `scripts/train.py` process (the default experiment's test preset, a checkpoint every
`--every` steps, metrics every step) with a shared, warmed compilation cache, so the difference is the
workdir's I/O: checkpoints through TensorStore, metrics.jsonl and samples.jsonl rewritten at each flush,
TensorBoard files copied, the lease renewed. A step's seconds are read from metrics.jsonl: the
`timing/since_launch_s` of the last step minus the first's, over the steps between (every checkpoint save and
flush included). The targets run in turn, `--rounds` times; each prints its median, and the ratio to local disk
measured in the same run. The emulators are local processes: this measures the client side (orbax, TensorStore,
fsspec, boto3), not a network's latency or bandwidth (docs/cloud.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from grpo_jax import storage  # noqa: E402
from grpo_jax.persist.metrics import read_jsonl  # noqa: E402
from tests.storage import conftest as stores  # noqa: E402  (the test suite's emulator launchers)


def _launch(workdir: str, steps: int, every: int, env: dict) -> float:
  """Seconds per step of one fresh training process in `workdir`."""
  argv = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config", "experiments/default.py:test",
          "--workdir", workdir, f"--config.num_steps={steps}", f"--config.checkpoint.every={every}",
          "--config.log.progress_bar=false", "--config.log.plot=false"]
  result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
  if result.returncode != 0:
    raise RuntimeError(f"{workdir}: exit {result.returncode}\n{result.stderr[-3000:]}")
  rows = [r for r in read_jsonl(storage.join(workdir, "metrics.jsonl")) if "timing/since_launch_s" in r]
  return (rows[-1]["timing/since_launch_s"] - rows[0]["timing/since_launch_s"]) / (rows[-1]["step"] - rows[0]["step"])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--every", type=int, default=5, help="checkpoint.every")
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory(prefix="store_bench_") as tmp:
    s3_port, gcs_port = stores.free_port(), stores.free_port()
    s3 = stores._start([stores._bin("moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)], s3_port, "moto_server")
    gcs = stores._start([stores.fake_gcs_server_binary(), "-backend", "memory", "-scheme", "http", "-host",
                         "127.0.0.1", "-port", str(gcs_port), "-public-host", f"127.0.0.1:{gcs_port}",
                         "-external-url", f"http://127.0.0.1:{gcs_port}", "-log-level", "error"],
                        gcs_port, "fake-gcs-server")
    try:
      base = dict(os.environ, PYTHONPATH=ROOT, TMPDIR=tmp, JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, "xla"),
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **stores.S3_ENV,
                  AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3_port}", STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{gcs_port}",
                  GOOGLE_CLOUD_PROJECT="bench")
      import boto3
      from google.auth.credentials import AnonymousCredentials
      from google.cloud import storage as gcs_client
      os.environ.update({k: base[k] for k in ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", *stores.S3_ENV)})
      boto3.client("s3").create_bucket(Bucket="bench")
      gcs_client.Client(project="bench", credentials=AnonymousCredentials()).create_bucket("bench")
      _launch(os.path.join(tmp, "warmup"), args.steps, args.every, base)  # fills the compilation cache
      targets = {"local disk": lambda: os.path.join(tmp, uuid.uuid4().hex),
                 "s3:// (moto)": lambda: f"s3://bench/{uuid.uuid4().hex}",
                 "gs:// (fake-gcs-server)": lambda: f"gs://bench/{uuid.uuid4().hex}"}
      seconds = {name: [] for name in targets}
      for _ in range(args.rounds):
        for name, workdir in targets.items():
          seconds[name].append(_launch(workdir(), args.steps, args.every, base))
      local = statistics.median(seconds["local disk"])
      print(f"{args.steps} steps, a checkpoint every {args.every}, {args.rounds} rounds "
            f"({time.strftime('%Y-%m-%d')}):")
      for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:24s} {median:.3f} s/step (runs: {', '.join(f'{v:.3f}' for v in values)})  "
              f"ratio to local disk {median / local:.2f}")
    finally:
      stores._stop(s3)
      stores._stop(gcs)


if __name__ == "__main__":
  main()
