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
  path = storage.absolute(directory)
  storage.makedirs(path)  # a gs:// or s3:// cache: JAX writes its entries through etils.epath, as we do
  jax.config.update("jax_compilation_cache_dir", path)
  return path


class CompileCounter:
  """The programs XLA compiled while it listens and their seconds, and the persistent cache's hits (programs
  loaded instead, with their seconds) and misses, from JAX's monitoring events: what the run says after its
  first evaluation and its first step, the two waits that compile.

    with CompileCounter() as compiled:
      ...                    # the first step
    compiled.describe()      # '1 program compiled in 41.2 s; compilation cache: 2 hits (loaded in 3.1 s), 1 miss'
  """
  _PROGRAM = "/jax/core/compile/backend_compile_duration"  # a compile, or a load from the cache (a hit)
  _LOADED = "/jax/compilation_cache/cache_retrieval_time_sec"  # a hit, with its seconds
  _LOOKUP = "/jax/compilation_cache/compile_requests_use_cache"

  def __init__(self):
    self.programs, self.program_s = 0, 0.0  # compiled or loaded from the cache
    self.hits, self.load_s, self.lookups = 0, 0.0, 0

  def _on_event(self, event: str, **_) -> None:
    self.lookups += event == self._LOOKUP

  def _on_duration(self, event: str, seconds: float, **_) -> None:
    if event == self._PROGRAM:
      self.programs, self.program_s = self.programs + 1, self.program_s + seconds
    elif event == self._LOADED:
      self.hits, self.load_s = self.hits + 1, self.load_s + seconds

  def start(self) -> "CompileCounter":
    jax.monitoring.register_event_listener(self._on_event)
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    return self

  def stop(self) -> None:
    jax.monitoring.unregister_event_listener(self._on_event)
    jax.monitoring.unregister_event_duration_listener(self._on_duration)

  __enter__ = start

  def __exit__(self, *exc) -> None:
    self.stop()

  def describe(self) -> str:
    compiled = self.programs - self.hits
    line = f"{compiled} program{'s' * (compiled != 1)} compiled in {max(self.program_s - self.load_s, 0):.1f} s"
    if not jax.config.jax_compilation_cache_dir:
      return line + "; compilation cache off"
    misses = self.lookups - self.hits
    return (line + f"; compilation cache: {self.hits} hit{'s' * (self.hits != 1)} (loaded in {self.load_s:.1f} s), "
            f"{misses} miss{'es' * (misses != 1)}")
