"""Suite-wide numerics: deterministic GPU ops, and an explicit float32 matmul precision where a test compares
with float64 numpy or with transformers.

XLA reads `--xla_gpu_deterministic_ops` once, when the backend starts, so it is set here, before any test
touches a device: on a GPU, a killed and resumed run must end bitwise identical (tests/train/test_loop.py).
CPUs ignore the flag. On a CPU-only JAX, tests compile with XLA's optimizations off (tests/xla_compiler.py).
`float32_matmuls` pins matmuls to full float32 (on NVIDIA GPUs the default is TF32,
~1e-3 relative, beyond the tolerances of the parity tests); on CPUs it changes nothing.

Ray writes each local instance's logs and uploaded working directories under $RAY_TMPDIR/ray (default /tmp/ray)
and never deletes them: repeated suite runs filled a CI disk. `_ray_temp_dir` gives each pytest worker its own
directory and removes it at the end.

The suite's processes share one persistent compilation cache (JAX_COMPILATION_CACHE_DIR, every program however
short to compile): most tests train the same tiny models at the same shapes, in the pytest workers and in the
commands they start, and a program compiled once is loaded by the others (a `gsm8k.py:test` run takes 9 s instead
of 22). The process that made the directory (the xdist controller, or pytest alone) removes it at the end. A
directory already set in the environment is used as it is and kept.

The commands, scripts, notebooks and workers that tests start as processes import grpo_jax from this checkout
(PYTHONPATH), whatever another one a Python environment has installed, with the hash seed that the commands'
launch would otherwise set by re-executing themselves (grpo_jax/hash_seed.py; tests/test_hash_seed.py unsets it).
"""
from __future__ import annotations

import os
import shutil
import tempfile

import jax
import pytest

from grpo_jax.precision import DETERMINISTIC_FLAG
from tests import xla_compiler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
os.environ.setdefault("PYTHONHASHSEED", "0")

# The first process (pytest alone, or xdist's controller) makes the directory; its workers inherit the variable.
_MADE_CACHE = None if os.environ.get("JAX_COMPILATION_CACHE_DIR") else tempfile.mkdtemp(prefix="grpo_jax-xla-")
if _MADE_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _MADE_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# JAX read its environment when it was imported, above.
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))


# The longest test files first (their seconds in a whole run with 3 workers, the 60 slowest tests summed per file,
# 2-core VM, 2026-11-29), the others after them in collection order: each file runs on one worker
# (scripts/test.sh: --dist loadfile --no-loadscope-reorder), and a long file started last kept one worker busy
# minutes after the others had finished.
LONGEST_FIRST = (
    "tests/recipes/test_family_recipes.py",     # 143 s
    "tests/train/test_calculator_learns.py",    # 116
    "tests/sweep/test_ray_cluster.py",          # 112
    "tests/sweep/test_ray.py",                  # 104
    "tests/recipes/test_recipes.py",            # 97
    "tests/train/test_default_fingerprint.py",  # 86
    "tests/test_first_day.py",                  # 65
    "tests/storage/test_store_workdir.py",      # 58
    "tests/distributed/test_memory_estimate.py",  # 56
    "tests/train/test_lora_learns.py",          # 54
    "tests/train/test_lora_training.py",        # 51
    "tests/distributed/test_mesh.py",           # 50
    "tests/model/test_moe.py",                  # 48
    "tests/train/test_partial_rollouts.py",     # 47
    "tests/distributed/test_multihost.py",      # 45
    "tests/train/test_rollouts_ahead.py",       # 40
    "tests/model/test_shared_prompt.py",        # 37
    "tests/train/test_loop.py",                 # 36
    "tests/model/test_qwen3_5.py",              # 36
    "tests/sampling/test_continuous_batching.py",  # 35
    "tests/model/test_lora.py",                 # 25
    "tests/train/test_faults.py",               # 24 (its default-suite points)
    "tests/data/test_chain_sum.py",             # 24
    "tests/train/test_length_buckets.py",       # 23
    "tests/train/test_curves_refresher.py",     # 19
    "tests/rewards/test_isolation.py",          # 17
)


def pytest_collection_modifyitems(config, items):
  rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


def pytest_unconfigure(config):
  if _MADE_CACHE:
    shutil.rmtree(_MADE_CACHE, ignore_errors=True)


if DETERMINISTIC_FLAG not in os.environ.get("XLA_FLAGS", "").split():
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + DETERMINISTIC_FLAG).strip()
xla_compiler.add_fast_compile()  # on a CPU-only JAX: tests/xla_compiler.py


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
