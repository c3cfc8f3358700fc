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

import importlib
import warnings
from typing import Callable

RewardFn = Callable[..., list]

_REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str, *, overwrite: bool = False, override: bool | None = None):
  """Decorator: `@register_reward("gsm8k_accuracy")` makes the function available to `get_reward`.

  Registering a different function under a taken name is an error unless `overwrite=True` (the keyword of
  `register_loss` too). Re-registering the same object, or a function with the same module and qualified name
  (a reloaded module, a re-run notebook cell), replaces it silently. `override=` is the old spelling: accepted,
  with a DeprecationWarning.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"reward name must be a non-empty string, got {name!r}")
  if override is not None:
    warnings.warn("register_reward(override=...) is deprecated; use overwrite=...", DeprecationWarning,
                  stacklevel=2)
    overwrite = overwrite or override

  def decorator(fn: RewardFn) -> RewardFn:
    if not callable(fn):
      raise TypeError(f"register_reward({name!r}) got a non-callable {fn!r}")
    existing = _REWARDS.get(name)
    if existing is not None and existing is not fn and not (overwrite or same_definition(existing, fn)):
      raise ValueError(f"a reward named {name!r} is already registered ({existing!r}); "
                       "pass overwrite=True to replace it")
    _REWARDS[name] = fn
    return fn

  return decorator


def same_definition(a: Callable, b: Callable) -> bool:
  """True for two functions defined by the same code: same module and qualified name."""
  key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))
  return key(a) == key(b) and key(a) != (None, None)


def get_reward(name_or_callable: str | RewardFn) -> RewardFn:
  """A callable is returned as is; a registered name or a "module:function" path is resolved."""
  if callable(name_or_callable):
    return name_or_callable
  if not isinstance(name_or_callable, str):
    raise TypeError(f"reward must be a name or a callable, got {type(name_or_callable).__name__}")
  name = name_or_callable
  if name in _REWARDS:
    return _REWARDS[name]
  if ":" in name:
    module_name, _, attr = name.partition(":")
    try:
      fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"cannot import reward function {name!r}: {e}") from e
    if not callable(fn):
      raise TypeError(f"{name!r} is not callable")
    return fn
  raise ValueError(f"unknown reward {name!r}; registered rewards: {', '.join(list_rewards())} "
                   "(or give an import path 'package.module:function')")


def registered_name(fn: RewardFn) -> str | None:
  """The name `fn` itself is registered under, or None."""
  return next((name for name, registered in _REWARDS.items() if registered is fn), None)


def list_rewards() -> list[str]:
  return sorted(_REWARDS)
