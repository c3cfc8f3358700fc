"""Reward functions by name.

A reward function has the signature

    fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]

where `columns` are the dataset row fields as lists aligned with `completions` (e.g. `answer=[...]`), and
the result holds one score per completion. `None` means "not applicable to this sample" (the scorer then
uses the fallback score and counts it separately from failures). Functions should accept `**columns` and
ignore the fields they do not use, so that any dataset can be scored by any set of functions.

Configs name a function by its registered name, by an import path "package.module:function", or pass the
callable itself.
"""
from __future__ import annotations

from typing import Callable, Hashable

from grpo_jax.config_checks import fail
from grpo_jax.registry import Registry
from grpo_jax.settings import Settings

RewardFn = Callable[..., list]

REWARDS = Registry("rewards", "reward", objects=True, import_paths=True)


def register_reward(name: str, *, overwrite: bool = False):
  """Decorator: `@register_reward("gsm8k_accuracy")` makes the function available to `get_reward`.

  `Registry.register`'s rules: a different function under a taken name is an error unless `overwrite=True`; the
  same object, or a function with the same module and qualified name, replaces it silently.
  """
  return REWARDS.register(name, overwrite=overwrite)


def get_reward(name_or_callable: str | RewardFn) -> RewardFn:
  """A callable is returned as is; a registered name or a "module:function" path is resolved."""
  if not (callable(name_or_callable) or isinstance(name_or_callable, str)):
    raise TypeError(f"reward must be a name or a callable, got {type(name_or_callable).__name__}")
  return REWARDS.get(name_or_callable)


def list_rewards() -> list[str]:
  return REWARDS.names()


# maj@k's vote (grpo_jax/stats/estimators.py): the answer a completion gives, as its verifier reads it.
AnswerKey = Callable[[str], Hashable | None]
ANSWER_KEYS: dict[str, AnswerKey] = {}


def register_answer_key(reward_name: str):
  """Decorator: `@register_answer_key("gsm8k_accuracy")` says which answer a completion gives under that reward:
  a hashable value that two completions share when they give the same answer, or None for no answer."""
  def register(fn: AnswerKey) -> AnswerKey:
    ANSWER_KEYS[reward_name] = fn
    return fn
  return register


def whole_completion(completion: str) -> str | None:
  """The answer key of a reward without its own: the stripped completion, None when empty."""
  return completion.strip() or None


def answer_key(reward_name: str) -> AnswerKey:
  """The registered answer key of a reward, else `whole_completion` (right for exact_match-like rewards)."""
  return ANSWER_KEYS.get(reward_name, whole_completion)


def validate_config(c: Settings, reward_callables=()) -> None:
  """`rewards`, `reward_funcs`, `reward_weights`, `reward_gates` of a run's settings: every reward resolves, each
  once, and `eval.accuracy_reward` is one of them; `reward_callables` names the callables a notebook passes to
  `train`."""
  if c.reward_weights and len(c.reward_weights) != len(c.reward_funcs):
    fail("reward_weights", f"has {len(c.reward_weights)} weights for {len(c.reward_funcs)} reward_funcs",
         c.reward_weights)
  overlap = set(c.reward_funcs) & set(c.rewards)
  if overlap or len(set(c.reward_funcs)) != len(c.reward_funcs):
    fail("reward_funcs", f"names a reward twice ({sorted(overlap) or list(c.reward_funcs)})", c.reward_funcs)
  weights = c.configured_rewards
  if not weights and not reward_callables:
    fail("rewards", "needs at least one reward function (name -> weight, or reward_funcs)")
  # Names first: a misspelt reward is the mistake to report, not the accuracy reward it leaves unmatched.
  for name in weights:
    try:
      get_reward(name)
    except (KeyError, ValueError, TypeError) as e:
      if name in c.reward_funcs:
        fail("reward_funcs", f"unknown reward function {name!r} ({e})")
      fail(f"rewards.{name}", f"unknown reward function ({e})", weights[name])
  if c.eval.accuracy_reward not in list(weights) + list(reward_callables):
    fail("eval.accuracy_reward", f"not one of the configured rewards {list(weights) + list(reward_callables)}",
         c.eval.accuracy_reward)
  for name, format_name in c.reward_gates.items():
    if name not in c.rewards:
      fail(f"reward_gates.{name}", f"gates a reward that is not configured; config.rewards has {list(c.rewards)}",
           format_name)
    try:
      get_reward(format_name)
    except (KeyError, ValueError) as e:
      fail(f"reward_gates.{name}", f"unknown format reward ({e})", format_name)
