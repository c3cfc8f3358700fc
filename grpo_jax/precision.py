"""The numerical precision policy of a run (`config.precision`): matmul precision and deterministic GPU ops.

matmul precision (`config.precision.matmul`, jax's `jax_default_matmul_precision`) of float32 matrix products:
  "default"  the backend's fastest: on NVIDIA GPUs since Ampere, TF32 (10-bit mantissa, about 1e-3 relative
             error); on TPUs, one bfloat16 pass; on CPUs, full float32.
  "high"     jax's Precision.HIGH: three bfloat16 passes on TPUs (about 1e-5 relative); on NVIDIA GPUs jax
             maps it to TF32 as well, so use "highest" there for float32 results.
  "highest"  full float32 everywhere (on an H100 several times slower than TF32 for large matmuls).
It applies to float32 compute (`model.dtype = "float32"`); bfloat16 matmuls are bfloat16 whatever it says.
With "default" on a GPU, the sampler's and the trainer's log-probs of the same tokens differ by ~1e-2 more than
on the CPU (see `logp_mismatch`), and results drift from the CPU's in the third digit.

deterministic (`config.precision.deterministic`): XLA's `--xla_gpu_deterministic_ops=true`, which makes GPU
reductions (scatter-adds, the order of atomics) run in a fixed order, so that a killed and resumed run ends
bitwise identical to an uninterrupted one. It is read once, when the backend starts: `apply` adds it to
XLA_FLAGS, which works when nothing has touched the devices yet (the launcher's case). CPU programs are
deterministic anyway.
"""
from __future__ import annotations

import os

import jax

DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"


def _backend_started() -> bool:
  from jax._src import xla_bridge  # no public API tells whether the backend has been initialised.
  return xla_bridge.backends_are_initialized()


def apply(p, log=print) -> None:
  """Sets the process-wide matmul precision and, when asked, deterministic GPU ops (module docstring). `p`: the
  run's `precision` section (grpo_jax/settings.py: PrecisionSettings, which checked its values).

  Raises ValueError when deterministic mode is asked after a GPU backend has started without the flag.
  """
  jax.config.update("jax_default_matmul_precision", None if p.matmul == "default" else p.matmul)
  if not p.deterministic:
    return
  flags = os.environ.get("XLA_FLAGS", "")
  if DETERMINISTIC_FLAG in flags.split():
    return
  if not _backend_started():
    os.environ["XLA_FLAGS"] = (flags + " " + DETERMINISTIC_FLAG).strip()
    return
  if jax.default_backend() == "cpu":
    log("[precision] deterministic: the CPU backend is deterministic already")
    return
  raise ValueError(f"config.precision.deterministic: the {jax.default_backend()} backend started before the flag "
                   f"could be set; run with XLA_FLAGS={DETERMINISTIC_FLAG} in the environment, or through "
                   "grpo-train")
