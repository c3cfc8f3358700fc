"""The checks of config values, shared by the settings sections and the modules that own a config section.

Each section checks its values (grpo_jax/settings.py: `OptimSettings.__post_init__`, ...), and the module that
consumes it what needs a registry or the disk (`grpo_jax.algo.advantages.validate_config(settings.grpo)`, ...),
through these helpers, so every error reads the same: `config.<key>=<value>: <what is allowed>`, a
`grpo_jax.errors.ConfigError` (one line and exit code 2 at the launchers).

  s = Section(self, "optim")
  s.positive("learning_rate")            # config.optim.learning_rate=0.0: must be > 0
  s.one_of("schedule", SCHEDULES)        # config.optim.schedule='linear': not one of ['constant', 'cosine']
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from grpo_jax.errors import ConfigError

_NO_VALUE = object()


def fail(key: str, allowed: str, value: Any = _NO_VALUE, root: str = "config."):
  """Raises the ConfigError `config.<key>=<value>: <allowed>` (without `=<value>` when none is given; `root`
  replaces "config." for values set in code, e.g. "LossConfig.")."""
  shown = "" if value is _NO_VALUE else f"={value!r}"
  raise ConfigError(f"{root}{key}{shown}: {allowed}")


class Section:
  """A config section (a ConfigDict or a grpo_jax/settings.py section, or the whole config with name "") with
  checks that name key and value."""

  def __init__(self, values, name: str = "", root: str = "config."):
    self.values, self.name, self.root = values, name, root

  def key(self, field: str) -> str:
    return f"{self.name}.{field}" if self.name else field

  def __getitem__(self, field: str):
    value = self.values
    for part in field.split("."):
      value = getattr(value, part) if dataclasses.is_dataclass(value) else value[part]  # a settings section
    return value

  def fail(self, field: str, allowed: str):
    fail(self.key(field), allowed, self[field], self.root)

  def at_least(self, low, *fields: str, why: str = ""):
    for field in fields:
      if self[field] < low:
        self.fail(field, f"must be >= {low}{why}")

  def positive(self, *fields: str):
    for field in fields:
      if not self[field] > 0:
        self.fail(field, "must be > 0")

  def within(self, field: str, low, high, *, open_low: bool = False, open_high: bool = False,
             or_none: bool = False):
    """low <= value <= high, each end open where asked; `or_none`: None is allowed too."""
    value = self[field]
    if or_none and value is None:
      return
    if not ((low < value if open_low else low <= value) and (value < high if open_high else value <= high)):
      interval = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
      self.fail(field, f"must be in {interval}{' or None' if or_none else ''}")

  def one_of(self, field: str, choices: Iterable):
    if self[field] not in tuple(choices):
      self.fail(field, f"not one of {list(choices)}")

  def registered(self, registry):
    """The value of the registry's key names one of its entries (a grpo_jax.registry.Registry; or, where it allows
    them, an import path); the registry's error names the registered ones and the closest."""
    field = registry.key.removeprefix(f"{self.name}.")
    try:
      registry.get(self[field])
    except (ValueError, TypeError) as e:
      self.fail(field, str(e))
