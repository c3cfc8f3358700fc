"""tests/xla_compiler.py: the suite compiles fast on a CPU-only JAX, and a default-compiler process gets XLA's
defaults back."""
from tests import xla_compiler


def test_fast_compile_is_added_once_and_an_explicit_choice_is_kept(monkeypatch):
  monkeypatch.setattr(xla_compiler, "cpu_only_jax", lambda: True)
  env = {"XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}
  xla_compiler.add_fast_compile(env)
  xla_compiler.add_fast_compile(env)
  assert env["XLA_FLAGS"].split() == ["--xla_gpu_deterministic_ops=true", *xla_compiler.FAST_COMPILE]
  assert xla_compiler.default_compiler_env(env)["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true"
  assert xla_compiler.fast_flags(env) == list(xla_compiler.FAST_COMPILE)
  mine = {"XLA_FLAGS": "--xla_backend_optimization_level=2"}
  xla_compiler.add_fast_compile(mine)
  assert mine == {"XLA_FLAGS": "--xla_backend_optimization_level=2"}


def test_an_accelerator_keeps_the_default_compiler(monkeypatch):
  monkeypatch.setattr(xla_compiler, "cpu_only_jax", lambda: False)
  env = {}
  xla_compiler.add_fast_compile(env)
  assert env == {}
