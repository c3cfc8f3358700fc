"""How the suite's processes compile. On a JAX without a GPU or TPU plugin, tests compile with XLA's
optimizations off (`FAST_COMPILE`): the suite's tiny models spend most of their time in the compiler, and the
whole suite's test time fell from 2,255 s to 1,628 s (2-core VM, 2026-11-27). The programs then run slower and
round differently, so what depends on XLA's default code runs in a subprocess with `default_compiler_env()`:
the recorded fingerprints (tests/train/test_default_fingerprint.py) and the runs that must learn by a margin
measured with it (`train_with_default_compiler` in tests/train/conftest.py). The persistent compilation cache
keys programs by XLA_FLAGS too, so the two kinds never load each other's programs."""
from __future__ import annotations

import importlib.metadata
import os

FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
_ACCELERATOR_PLUGINS = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu")


def cpu_only_jax() -> bool:
  """No GPU or TPU plugin is installed (on an accelerator the suite keeps XLA's defaults)."""
  names = (dist.metadata["Name"] or "" for dist in importlib.metadata.distributions())
  return not any(name.lower().startswith(_ACCELERATOR_PLUGINS) for name in names)


def add_fast_compile(environ=os.environ) -> None:
  """Appends FAST_COMPILE to environ's XLA_FLAGS on a CPU-only JAX, unless XLA_FLAGS already sets either."""
  flags = environ.get("XLA_FLAGS", "")
  if cpu_only_jax() and not any(f.split("=")[0] in flags for f in FAST_COMPILE):
    environ["XLA_FLAGS"] = " ".join([flags, *FAST_COMPILE]).strip()


def fast_flags(environ=os.environ) -> list[str]:
  """The FAST_COMPILE flags environ's XLA_FLAGS has: what a worker that sets its own XLA_FLAGS keeps."""
  return [f for f in environ.get("XLA_FLAGS", "").split() if f in FAST_COMPILE]


def default_compiler_env(environ=os.environ) -> dict[str, str]:
  """A copy of environ for a process that compiles with XLA's default optimizations."""
  env = dict(environ)
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE)
  return env
