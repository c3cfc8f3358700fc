"""The entry points of the commands that pin the hash seed (grpo_jax/hash_seed.py) and import JAX: each pins it
before it imports its command, so the re-execution that pins it costs one interpreter start, not JAX's import
as well. `python -m grpo_jax.commands.train` pins it too, after its imports. (grpo-sweep imports no JAX.)"""
import importlib
import os
import sys

from grpo_jax import hash_seed, signals
from grpo_jax.errors import EXIT_PREEMPTED


def preempted_while_starting(signum, frame):
  """SIGTERM / SIGINT before the trainer has started (imports, flags, the hash seed's re-execution): nothing to
  save, so the process ends at once with the preempted exit code, and a sweep retries the member instead of
  counting a failure. Not sys.exit: raised inside the import of a C extension (jaxlib), SystemExit aborted the
  process (code -6); without a handler the signal kills it (-15). The trainer installs its own handler."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(EXIT_PREEMPTED)


def _pinned(command: str) -> None:
  hash_seed.pin()
  importlib.import_module(f"grpo_jax.commands.{command}").main()


def train() -> None:
  """`grpo-train` and scripts/train.py."""
  signals.install(preempted_while_starting)  # first: JAX's import takes seconds
  _pinned("train")


def evaluate() -> None:
  """`grpo-evaluate` and scripts/evaluate.py."""
  _pinned("evaluate")

