"""The persistent compilation cache and a Hugging Face model directory on a store: a second process loads the
programs the first compiled there, and a model on the store is mirrored locally once and loads like the local
directory."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
from etils import epath
from flax import nnx

from grpo_jax import storage
from tests.train.conftest import ROOT

PROGRAM = """
import jax, jax.numpy as jnp
from jax._src import monitoring
from grpo_jax import compile_cache
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name) if "cache_hits" in name else None)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
print("cache:", compile_cache.enable({url!r}))
print(float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64))).sum()))
print("hits:", len(hits))
"""


def _process(url: str, env: dict) -> str:
  result = subprocess.run([sys.executable, "-c", PROGRAM.format(url=url)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, **env, JAX_COMPILATION_CACHE_DIR="",
                                                          PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_a_second_process_loads_the_program_the_first_compiled_into_a_cache_on_a_store(s3):
  url = s3.url("xla")
  first = _process(url, s3.env)
  assert f"cache: {url}" in first and "hits: 0" in first
  assert storage.listdir(url)  # the entries are objects on the store
  second = _process(url, s3.env)
  assert int(second.rsplit("hits:", 1)[1]) > 0  # each of its programs (ones, the jitted function) from the store
  epath.Path(url).rmtree(missing_ok=True)


def test_a_model_directory_on_a_store_is_mirrored_once_and_loads_like_the_local_one(s3, tmp_path, monkeypatch):
  from grpo_jax import testing
  from grpo_jax.model import hf_io
  local = testing.build_checkpoint(str(tmp_path / "model"))  # a tiny random Llama with its tokenizer
  url = s3.url("model")
  for name in os.listdir(local):
    storage.copy(os.path.join(local, name), storage.join(url, name))
  monkeypatch.setenv("GRPO_JAX_MODEL_CACHE", str(tmp_path / "cache"))
  mirror = storage.local_dir(url)
  assert sorted(os.listdir(mirror)) == sorted(os.listdir(local))
  before = {n: os.path.getmtime(os.path.join(mirror, n)) for n in os.listdir(mirror)}
  assert storage.local_dir(url) == mirror
  assert {n: os.path.getmtime(os.path.join(mirror, n)) for n in os.listdir(mirror)} == before  # not fetched again
  a, b = (nnx.state(hf_io.from_pretrained(d), nnx.Param) for d in (local, mirror))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  epath.Path(url).rmtree(missing_ok=True)
