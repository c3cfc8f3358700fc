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
