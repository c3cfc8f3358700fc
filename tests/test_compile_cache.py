"""`config.compile_cache_dir` (grpo_jax/compile_cache.py): where JAX's persistent compilation cache goes."""
from __future__ import annotations

import os

import jax
import pytest

from grpo_jax import compile_cache


@pytest.fixture
def no_cache_dir():
  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", None)
  yield
  jax.config.update("jax_compilation_cache_dir", before)


def test_the_configured_directory_is_created_and_used(no_cache_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  assert compile_cache.enable("~/cache/xla") == str(tmp_path / "cache" / "xla")
  assert os.path.isdir(tmp_path / "cache" / "xla")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache" / "xla")


def test_auto_is_off_on_a_cpu_and_the_default_directory_elsewhere(no_cache_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  assert compile_cache.enable("auto") is None and jax.config.jax_compilation_cache_dir is None
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert compile_cache.enable("auto") == str(tmp_path / ".cache" / "grpo_jax" / "xla")


def test_empty_turns_it_off_and_a_directory_set_through_jax_wins(no_cache_dir, tmp_path):
  assert compile_cache.enable("") is None
  assert jax.config.jax_compilation_cache_dir is None
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
  assert compile_cache.enable(str(tmp_path / "config")) == str(tmp_path / "mine")
  assert not os.path.exists(tmp_path / "config")


_COUNTED = """
import sys, jax, jax.numpy as jnp
from grpo_jax import compile_cache
if sys.argv[1]:
  jax.config.update("jax_compilation_cache_dir", sys.argv[1])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # this tiny program is cached too
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
x = jnp.arange(4.0)
with compile_cache.CompileCounter() as compiled:
  jax.jit(lambda x: jnp.sin(x) * 3)(x).block_until_ready()
print(compiled.describe())
"""


def test_the_first_waits_say_what_compiled_and_what_the_cache_gave(tmp_path):
  import subprocess
  import sys

  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # not the suite's cache

  def counted(cache_dir: str) -> str:  # a fresh process: nothing in JAX's in-memory caches
    done = subprocess.run([sys.executable, "-c", _COUNTED, cache_dir], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()

  assert counted("").startswith("1 program compiled in ")
  assert counted("").endswith("; compilation cache off")
  cold, warm = counted(str(tmp_path / "xla")), counted(str(tmp_path / "xla"))
  assert cold.startswith("1 program compiled in ") and cold.endswith("compilation cache: 0 hits (loaded in 0.0 s), "
                                                                      "1 miss"), cold
  assert warm.startswith("0 programs compiled in 0.0 s; compilation cache: 1 hit (loaded in "), warm
  assert warm.endswith(" s), 0 misses"), warm
