"""The environment interface of multi-turn episodes (grpo_jax/sampling/episodes.py runs them).

An episode starts from a task's prompt. The policy writes a message (one sampler call, which stops at the stop
token or at one of the environment's `stop_strings`); the environment answers with `step(message)`: an
observation (text the episode continues with, in the policy's context but never trained on), a reward, and
whether the episode is over. The policy's next message continues after the observation; after `max_turns`
messages the episode ends whatever the environment says. `Environment` and `StepResult` are defined by the
episodes that run them (grpo_jax/sampling/episodes.py) and exported here.

The episode's reward is the sum of its step rewards plus the configured reward functions scored on its last
message (so an environment that only executes tools leaves the grading to the task's usual rewards). GRPO
gives the whole episode one group-relative advantage, shared by every policy token in it.
"""
from __future__ import annotations

from typing import Callable

from grpo_jax.registry import Registry
from grpo_jax.sampling.episodes import Environment, StepResult  # noqa: F401  (the interface, defined where it runs)
from grpo_jax.sampling.text import encode_text

# name -> environment class; the built-in environments are plug-ins like any other, registered on import.
ENVIRONMENTS = Registry("env.name", "environment", builtins=("grpo_jax.envs.calculator",), import_paths=True)


def register_env(name: str, *, overwrite: bool = False):
  """Decorator: `@register_env("calculator") class Calculator(Environment): ...` makes `env.name` accept it
  (an environment outside grpo_jax can also be named by its import path, `env.name = "pkg.module:Class"`)."""
  return ENVIRONMENTS.register(name, overwrite=overwrite)


def env_factory(name: str) -> Callable[[], Environment]:
  """A registered environment's factory, or the one at an import path "package.module:Class" (a callable of no
  arguments returning an `Environment`)."""
  return ENVIRONMENTS.get(name)


def stop_token_ids(env: Environment, tokenizer) -> tuple[int, ...]:
  """The ids of `env.stop_strings` (ValueError unless each is a single token of `tokenizer`)."""
  ids = []
  for s in env.stop_strings:
    encoded = encode_text(tokenizer, s)
    if len(encoded) != 1:
      raise ValueError(f"environment stop string {s!r} is {len(encoded)} tokens of this tokenizer, not one")
    ids.append(int(encoded[0]))
  return tuple(ids)
