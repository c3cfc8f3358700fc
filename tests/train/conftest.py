"""Shared fixtures of the training tests: tiny configs, and a persistent compilation cache so the several
short runs of one test module compile each program once."""
from __future__ import annotations

import importlib.util
import os

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_experiment(name: str = "default"):
  """The `get_config` of experiments/NAME.py."""
  path = os.path.join(ROOT, "experiments", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"experiment_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config


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
