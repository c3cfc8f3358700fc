"""The entry points of the commands that pin the hash seed (grpo_jax/hash_seed.py) and import JAX: each pins it
before it imports its command, so the re-execution that pins it costs one interpreter start, not JAX's import
as well. `python -m grpo_jax.commands.train` pins it too, after its imports. (grpo-sweep imports no JAX.)"""
import importlib

from grpo_jax import hash_seed


def _pinned(command: str) -> None:
  hash_seed.pin()
  importlib.import_module(f"grpo_jax.commands.{command}").main()


def train() -> None:
  """`grpo-train` and scripts/train.py."""
  _pinned("train")


def evaluate() -> None:
  """`grpo-evaluate` and scripts/evaluate.py."""
  _pinned("evaluate")

