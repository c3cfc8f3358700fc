"""Suite-wide numerics: deterministic GPU ops, and an explicit float32 matmul precision where a test compares
with float64 numpy or with transformers.

XLA reads `--xla_gpu_deterministic_ops` once, when the backend starts, so it is set here, before any test
touches a device: on a GPU, a killed and resumed run must end bitwise identical (tests/train/test_loop.py).
CPUs ignore the flag. `float32_matmuls` pins matmuls to full float32 (on NVIDIA GPUs the default is TF32,
~1e-3 relative, beyond the tolerances of the parity tests); on CPUs it changes nothing.

Ray writes each local instance's logs and uploaded working directories under $RAY_TMPDIR/ray (default /tmp/ray)
and never deletes them: repeated suite runs filled a CI disk. `_ray_temp_dir` gives each pytest worker its own
directory and removes it at the end.

The commands, scripts, notebooks and workers that tests start as processes import grpo_jax from this checkout
(PYTHONPATH), whatever another one a Python environment has installed, with the hash seed that the commands'
launch would otherwise set by re-executing themselves (grpo_jax/hash_seed.py; tests/test_hash_seed.py unsets it).
"""
from __future__ import annotations

import os
import tempfile

import jax
import pytest

from grpo_jax.precision import DETERMINISTIC_FLAG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
os.environ.setdefault("PYTHONHASHSEED", "0")

if DETERMINISTIC_FLAG not in os.environ.get("XLA_FLAGS", "").split():
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + DETERMINISTIC_FLAG).strip()


@pytest.fixture
def float32_matmuls():
  with jax.default_matmul_precision("highest"):
    yield


@pytest.fixture(scope="session", autouse=True)
def _ray_temp_dir():
  # Directly under $TMPDIR, not tmp_path_factory's deeper one: Ray's socket paths must stay within 107 bytes.
  with tempfile.TemporaryDirectory(prefix="ray-tests-", ignore_cleanup_errors=True) as path, \
       pytest.MonkeyPatch.context() as patch:
    patch.setenv("RAY_TMPDIR", path)
    yield


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  """A persistent compilation cache for one test module's training processes: the later ones load its programs."""
  return tmp_path_factory.mktemp("xla_cache")
