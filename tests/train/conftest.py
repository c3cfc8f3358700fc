"""Shared fixtures of the training tests: tiny configs, and a persistent compilation cache so the several
short runs of one test module compile each program once."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from tests.xla_compiler import default_compiler_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_experiment(name: str = "default"):
  """The `get_config` of experiments/NAME.py."""
  path = os.path.join(ROOT, "experiments", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"experiment_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config


def train_with_default_compiler(experiment: str, workdir, overrides: dict) -> list[dict]:
  """Trains experiments/EXPERIMENT.py with `--config.KEY=VALUE` overrides as `scripts/train.py`, in a process
  that compiles with XLA's default optimizations (tests/xla_compiler.py); returns metrics.jsonl's evaluation rows."""
  done = subprocess.run([sys.executable, "scripts/train.py", "--config", f"experiments/{experiment}.py",
                         "--workdir", str(workdir), *(f"--config.{k}={v}" for k, v in overrides.items())],
                        cwd=ROOT, env=default_compiler_env(), capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if "eval/accuracy" in r]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  """A persistent XLA cache for this module only (the settings are restored afterwards)."""
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_min_entry_size_bytes")
  old = {n: getattr(jax.config, n) for n in names}
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  compilation_cache.reset_cache()
  yield
  for n, v in old.items():
    jax.config.update(n, v)
  compilation_cache.reset_cache()
