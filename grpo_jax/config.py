"""The base experiment config: every default of a grpo_jax run (grpo_jax/settings.py), and saved configs.

Experiment files (`experiments/NAME.py`) start from `get_config()` and change what they need; the launcher
locks the result, so a misspelt key on the command line (`--config.grpo.betta=0`) is an error, and
ml_collections rejects values of the wrong type (`--config.num_steps=abc`). `grpo_jax.train.checks.validate(config)`
then checks the values, before anything is compiled: numbers and choices by grpo_jax/settings.py, registered names
by the registries' owners (`validate_config` in grpo_jax/algo/objective.py, grpo_jax/rewards/registry.py, ...),
then the values that must agree across sections; an error reads `config.<key>=<value>: <what is allowed>` (grpo_jax/config_checks.py). This
module is plain data and imports no layer above the base one (setup.cfg's contracts), so any module may read it.
"""
from __future__ import annotations

import dataclasses
import typing

import ml_collections
from ml_collections import config_dict

from grpo_jax import settings


def get_config() -> ml_collections.ConfigDict:
  """The base config, generated from grpo_jax/settings.py: every field an experiment may set, at its default."""
  return _config_dict(settings.Settings)


def _config_dict(cls) -> ml_collections.ConfigDict:
  """A settings class as a ConfigDict: a section per nested class, a ConfigDict per name -> value map (set whole),
  and a typed placeholder per field whose default is None (so `--config.grpo.delta=3.0` still parses)."""
  out = ml_collections.ConfigDict()
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    kind = hints[field.name]
    if dataclasses.is_dataclass(kind):
      out[field.name] = _config_dict(kind)
      continue
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if isinstance(value, dict):
      out[field.name] = ml_collections.ConfigDict(value)
    elif value is None:
      out[field.name] = config_dict.placeholder(next(t for t in typing.get_args(kind) if t is not type(None)))
    else:
      out[field.name] = value
  return out


def _map_keys(cls=settings.Settings, prefix: str = "") -> frozenset[str]:
  """The dotted keys of the config's name -> value maps (settings.py's `dict` fields: rewards, reward gates, a
  task's field map and options), which are set, saved and compared whole."""
  hints = typing.get_type_hints(cls)
  out: set[str] = set()
  for field in dataclasses.fields(cls):
    if dataclasses.is_dataclass(hints[field.name]):
      out |= _map_keys(hints[field.name], f"{prefix}{field.name}.")
    elif hints[field.name] is dict:
      out.add(prefix + field.name)
  return frozenset(out)


MAP_KEYS = _map_keys()


def _get(c, key):
  for part in filter(None, key.split(".")):
    c = c[part]
  return c


def resumable_keys(cls=settings.Settings, prefix: str = "") -> tuple[str, ...]:
  """The keys a resumed run may change (settings.py's `resumable` fields; "section." for a section marked
  RESUMABLE): any other difference from the saved config.json is refused."""
  if getattr(cls, "RESUMABLE", False):
    return (prefix,)
  hints = typing.get_type_hints(cls)
  out: list[str] = []
  for field in dataclasses.fields(cls):
    if dataclasses.is_dataclass(hints[field.name]):
      out += resumable_keys(hints[field.name], f"{prefix}{field.name}.")
    elif field.metadata.get("resumable"):
      out.append(prefix + field.name)
  return tuple(out)


RESUMABLE_CHANGES = resumable_keys()


def keys(config=None) -> list[str]:
  """Every key of the config (default: the base config), dotted, sections included."""
  def walk(node, prefix):
    for key, value in node.items():
      yield prefix + key
      if isinstance(value, ml_collections.ConfigDict):
        yield from walk(value, f"{prefix}{key}.")

  return list(walk(get_config() if config is None else config, ""))


def unknown_key_message(key: str) -> str:
  """One line for a key the config does not have, naming the closest keys."""
  import difflib
  known = [k for k in keys() if not isinstance(_get(get_config(), k), ml_collections.ConfigDict) or k in MAP_KEYS]
  leaf = key.rsplit(".", 1)[-1]
  close = [k for k in known if k.rsplit(".", 1)[-1] == leaf]  # the same name in another section
  close += [k for k in difflib.get_close_matches(key, known, n=3, cutoff=0.6) if k not in close]
  hint = f"; did you mean {' or '.join(f'config.{k}' for k in close[:3])}?" if close else ""
  return (f"config.{key}: no such key{hint} (every key and its default: docs/config.md)")


def saved_with_defaults(saved: dict) -> ml_collections.ConfigDict:
  """A saved config.json as a ConfigDict, with every field the run predates (e.g. a config group added later) at
  its default, so the code of today reads a run of yesterday (a key the code no longer has is kept, unread)."""
  config = get_config()

  def merge(target, values: dict, prefix: str):
    for key, value in values.items():  # a map (MAP_KEYS): the saved one replaces ours
      if (isinstance(value, dict) and isinstance(target.get(key), ml_collections.ConfigDict)
          and prefix + key not in MAP_KEYS):
        merge(target[key], value, f"{prefix}{key}.")
      else:
        with target.ignore_type():
          target[key] = value

  merge(config, saved, "")
  return config


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and prefix + key not in MAP_KEYS:
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def resume_differences(saved: dict, config) -> tuple[list[str], list[str]]:
  """(conflicts, accepted): the fields where `config` differs from the `saved` config (a run's config.json), as
  "field: saved -> new" lines, split into those a resume may not change and those it may (RESUMABLE_CHANGES)."""
  import json
  old, new = _flatten(saved), _flatten(json.loads(config.to_json_best_effort()))
  conflicts, accepted = [], []
  for key in sorted(old.keys() & new.keys()):  # a field the saved run predates is not a difference
    if old[key] != new[key]:
      resumable = any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)
      (accepted if resumable else conflicts).append(f"{key}: {old[key]!r} -> {new[key]!r}")
  return conflicts, accepted
