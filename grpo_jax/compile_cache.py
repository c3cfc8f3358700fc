"""JAX's persistent compilation cache (`config.compile_cache_dir`): compiled programs are written to disk and a
later process with the same programs loads them instead of compiling again.

A run's programs (the sampler's prefill and decode, the reference log-probs, the update at each length bucket,
the evaluator) are keyed by their HLO, the devices and the jax/XLA versions, so a resumed run, a rerun, and the
other seeds of a sweep with the same shapes all hit the cache. On an H100 the GSM8K recipe's update at the
Qwen2.5-0.5B shape compiled in 56 s and came back from the cache in 12 s; on the 2-core CPU, SmolLM2's update
took 74 s to compile and 50 s to load (XLA:CPU's executables load slowly), and a whole resumed SmolLM2 run
gained nothing (benchmarks/compile_cache_bench.py). Hence the default:
  "auto"   ~/.cache/grpo_jax/xla on GPUs and TPUs, off on CPUs;
  a path   that directory on every backend;
  ""       off.
A directory set through JAX itself (JAX_COMPILATION_CACHE_DIR, or
`jax.config.update("jax_compilation_cache_dir", ...)`) wins. Entries are never evicted: delete the directory to
reclaim the space.

The directory may be on a store (gs://bucket/xla, s3://bucket/xla; grpo_jax/storage.py), so a fresh spot VM
loads the programs its predecessors compiled instead of compiling from nothing.
"""
from __future__ import annotations

import os

import jax

from grpo_jax import storage

AUTO = "auto"
DEFAULT_DIR = "~/.cache/grpo_jax/xla"


def enable(directory: str) -> str | None:
  """Points JAX's persistent cache at `directory` ("auto": see the module docstring) unless JAX already has
  one; returns the directory in use, or None. Call it after `jax.distributed` is initialized ("auto" asks
  for the backend)."""
  current = jax.config.jax_compilation_cache_dir
  if current or not directory:
    return current or None
  if directory == AUTO:
    if jax.default_backend() == "cpu":
      return None
    directory = DEFAULT_DIR
  path = storage.absolute(directory if storage.is_url(directory) else os.path.expanduser(directory))
  storage.makedirs(path)  # a gs:// or s3:// cache: JAX writes its entries through etils.epath, as we do
  jax.config.update("jax_compilation_cache_dir", path)
  return path
