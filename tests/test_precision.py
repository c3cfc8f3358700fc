"""The precision policy (`config.precision`): matmul precision and deterministic GPU ops."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import config as config_lib
from grpo_jax import precision
from grpo_jax.settings import PrecisionSettings
from grpo_jax.train import checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(matmul="default", deterministic=False):
  c = config_lib.get_config()
  c.precision.matmul = matmul
  c.precision.deterministic = deterministic
  return c


def _precision(matmul="default", deterministic=False) -> PrecisionSettings:
  """The run's `precision` section, as grpo_jax.train.loop passes it to precision.apply."""
  return PrecisionSettings(matmul=matmul, deterministic=deterministic)


@pytest.fixture
def restore_matmul_precision():
  before = jax.config.jax_default_matmul_precision
  yield
  jax.config.update("jax_default_matmul_precision", before)


@pytest.mark.parametrize("matmul, expected", [("default", None), ("high", "high"), ("highest", "highest")])
def test_matmul_precision_is_set_process_wide(matmul, expected, restore_matmul_precision):
  precision.apply(_precision(matmul))
  assert jax.config.jax_default_matmul_precision == expected


def test_highest_precision_matches_float64_on_this_backend(restore_matmul_precision):
  precision.apply(_precision("highest"))
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(64, 256)), rng.normal(size=(256, 32))
  got = jax.jit(jnp.matmul)(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  np.testing.assert_allclose(np.asarray(got), a @ b, rtol=0, atol=1e-4)   # TF32 would be off by ~1e-2


def test_unknown_matmul_precision_is_a_config_error_naming_the_field():
  with pytest.raises(ValueError, match=r"config\.precision\.matmul='tf32': not one of"):
    checks.validate(_config("tf32"))


def test_deterministic_mode_sets_the_xla_flag_before_the_backend_starts():
  # A fresh interpreter: the flag must be in XLA_FLAGS when the backend starts, and the backend must accept it.
  code = ("import os, jax\n"
          "from grpo_jax import precision\n"
          "from grpo_jax.settings import PrecisionSettings\n"
          "precision.apply(PrecisionSettings(deterministic=True))\n"
          "assert precision.DETERMINISTIC_FLAG in os.environ['XLA_FLAGS'].split(), os.environ['XLA_FLAGS']\n"
          "print(float(jax.numpy.ones(3).sum()))\n")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["XLA_FLAGS"] = "--xla_cpu_enable_fast_math=false"  # flags already there are kept
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "3.0"


def test_deterministic_mode_after_the_backend_started(monkeypatch):
  """Too late for the flag: a no-op on the CPU (deterministic anyway), an error that names the fix on a GPU."""
  jax.devices()  # the backend is running
  monkeypatch.setenv("XLA_FLAGS", "")
  messages = []
  if jax.default_backend() == "cpu":
    precision.apply(_precision(deterministic=True), log=messages.append)
    assert messages == ["[precision] deterministic: the CPU backend is deterministic already"]
  else:
    with pytest.raises(ValueError, match=f"the {jax.default_backend()} backend started before the flag"):
      precision.apply(_precision(deterministic=True), log=messages.append)
  assert os.environ["XLA_FLAGS"] == ""


