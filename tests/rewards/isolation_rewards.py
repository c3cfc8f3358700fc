"""Module-level reward functions for tests/rewards/test_isolation.py (the reward worker imports this module)."""
import os
import re

from grpo_jax.rewards.registry import register_reward


def spin(prompts, completions, **columns):
  """Never returns, and keeps a core busy."""
  while True:
    pass


def backtracking_regex(prompts, completions, **columns):
  """Holds the GIL for seconds: catastrophic backtracking inside the C regex engine (one call, no bytecode)."""
  return [float(re.fullmatch(r"(a|aa)+b", "a" * 40) is not None) for _ in completions]


def pid(prompts, completions, **columns):
  """The process that ran the call."""
  return [float(os.getpid())] * len(completions)


def divide_by_zero(prompts, completions, **columns):
  return [1 / 0 for _ in completions]


def exit_process(prompts, completions, **columns):
  os._exit(3)


def make_length_reward(scale):
  def length(prompts, completions, **columns):
    return [scale * len(c) for c in completions]
  return length


registered_length = register_reward("test_isolation_length")(make_length_reward(2.0))


def make_pid_reward():
  def pid_closure(prompts, completions, **columns):
    return [float(os.getpid())] * len(completions)
  return pid_closure


registered_pid = register_reward("test_isolation_pid")(make_pid_reward())
registered_spin = register_reward("test_isolation_spin")(spin)


def digit_count(prompts, completions, **columns):
  """Digits in each completion: varies across a random model's samples, so its groups carry an advantage."""
  return [float(sum(ch.isdigit() for ch in c)) for c in completions]
