#!/usr/bin/env python
"""Checkpoint saves at a real model's shape: synchronous with a SHA-256 of the bytes (how grpo_jax saved before)
against asynchronous with the on-device fingerprint (`checkpoint.async_save`, the default now).

  .venv/bin/python benchmarks/checkpoint_bench.py                          # Qwen2.5-0.5B shape, float32
  .venv/bin/python benchmarks/checkpoint_bench.py --model qwen2.5-1.5b --dir /fast/disk

The state is what the trainer saves with beta = 0: random float32 parameters of the preset's shape
(scripts/memory_estimate.py's PRESETS) and their AdamW state (two moments), 3 x 4 bytes per parameter. Each way
saves it `--saves` times into a fresh directory (keep 2) and reports, per save, the time the training loop is
blocked (the `save` call) and the time until the checkpoint is on disk and committed; then the time to check a
restored state (SHA-256 over host copies against the fingerprint). The ways alternate so both see the same disk.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time



def sha256_of(state) -> str:
  """The baseline's check: SHA-256 over the leaves' key paths, dtypes, shapes and bytes (host copies), what
  checkpoints stored before the on-device fingerprint."""
  import jax
  import numpy as np
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    arr = np.asarray(jax.device_get(leaf))
    h.update(jax.tree_util.keystr(path).encode())
    h.update(f"{arr.dtype}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
  return h.hexdigest()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="qwen2.5-0.5b")
  parser.add_argument("--saves", type=int, default=2)
  parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
  args = parser.parse_args(argv)

  import jax
  import optax
  from flax import nnx

  from grpo_jax.commands import memory_estimate as me
  from grpo_jax.model import Transformer
  from grpo_jax.persist.checkpoint import Checkpointer
  from grpo_jax.persist.fingerprint import state_fingerprint

  cfg = me.model_config(args.model, "float32", "float32")
  t0 = time.perf_counter()
  params = jax.jit(lambda: nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))[1])()
  state = {"params": params, "opt_state": jax.jit(optax.adamw(1e-6).init)(params)}
  jax.block_until_ready(state)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  print(f"{args.model}: state of {nbytes / 2**30:.2f} GiB ({len(jax.tree.leaves(state))} arrays) built in "
        f"{time.perf_counter() - t0:.1f} s; jax {jax.__version__}, {jax.devices()[0].platform}, "
        f"load average {os.getloadavg()[0]:.2f}", flush=True)

  root = args.dir or tempfile.mkdtemp(prefix="checkpoint_bench_")
  ways = {"sync + SHA-256": dict(async_save=False, verify=False), "async + fingerprint": dict(async_save=True,
                                                                                              verify=True)}
  checkpointers = {name: Checkpointer(os.path.join(root, name.split()[0]), keep=2, **kw)
                   for name, kw in ways.items()}
  blocked = {name: [] for name in ways}
  total = {name: [] for name in ways}
  try:
    for i in range(args.saves):
      for name, ck in checkpointers.items():
        t0 = time.perf_counter()
        meta = {"data_position": i}
        if name.startswith("sync"):  # the old save: a SHA-256 of host copies, then a synchronous write
          meta["state_sha256"] = sha256_of(state)
        ck.save(i + 1, state, meta)
        blocked[name].append(time.perf_counter() - t0)
        ck.wait()
        total[name].append(time.perf_counter() - t0)
        print(f"save {i + 1}, {name}: loop blocked {blocked[name][-1]:.1f} s, on disk after {total[name][-1]:.1f} s",
              flush=True)
    t0 = time.perf_counter()
    sha256_of(state)
    t_sha = time.perf_counter() - t0
    t0 = time.perf_counter()
    state_fingerprint(state)
    t_fp = time.perf_counter() - t0
  finally:
    for ck in checkpointers.values():
      ck.close()
    if not args.dir:
      shutil.rmtree(root, ignore_errors=True)

  print("\n| way | loop blocked per save (s, median) | until on disk (s, median) |\n|---|---|---|")
  for name in ways:
    print(f"| {name} | {statistics.median(blocked[name]):.2f} | {statistics.median(total[name]):.2f} |")
  b_old, b_new = statistics.median(blocked["sync + SHA-256"]), statistics.median(blocked["async + fingerprint"])
  print(f"the loop waits {b_old / b_new:.1f}x less per save; verification of a restored state: SHA-256 "
        f"{t_sha:.1f} s, fingerprint {t_fp:.2f} s ({t_sha / t_fp:.0f}x)")


if __name__ == "__main__":
  main()
