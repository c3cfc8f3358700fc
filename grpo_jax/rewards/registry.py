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

import warnings
from typing import Callable

from grpo_jax.registry import Registry

RewardFn = Callable[..., list]

REWARDS = Registry("reward", objects=True, import_paths=True)


def register_reward(name: str, *, overwrite: bool = False, override: bool | None = None):
  """Decorator: `@register_reward("gsm8k_accuracy")` makes the function available to `get_reward`.

  `Registry.register`'s rules: a different function under a taken name is an error unless `overwrite=True`; the
  same object, or a function with the same module and qualified name, replaces it silently. `override=` is the
  old spelling: accepted, with a DeprecationWarning.
  """
  if override is not None:
    warnings.warn("register_reward(override=...) is deprecated; use overwrite=...", DeprecationWarning,
                  stacklevel=2)
    overwrite = overwrite or override
  return REWARDS.register(name, overwrite=overwrite)


def get_reward(name_or_callable: str | RewardFn) -> RewardFn:
  """A callable is returned as is; a registered name or a "module:function" path is resolved."""
  if not (callable(name_or_callable) or isinstance(name_or_callable, str)):
    raise TypeError(f"reward must be a name or a callable, got {type(name_or_callable).__name__}")
  return REWARDS.get(name_or_callable)


def registered_name(fn: RewardFn) -> str | None:
  """The name `fn` itself is registered under, or None."""
  return REWARDS.name_of(fn)


def list_rewards() -> list[str]:
  return REWARDS.names()
