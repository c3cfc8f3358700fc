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


def _get(c, key):
  for part in filter(None, key.split(".")):
    c = c[part]
  return c


# Fields a resumed run may change: when to stop, what to log, how often to save or evaluate, what an evaluation
# samples (the eval/avg@N, pass@k, maj@k figures change from the resume on; training does not), and how the same
# computation is laid out on the devices. Any other change would make the resumed run a different experiment.
RESUMABLE_CHANGES = ("num_steps", "log.", "checkpoint.every", "checkpoint.keep", "checkpoint.async_save",
                     "checkpoint.preemption_deadline_s", "checkpoint.preemption_notice", "checkpoint.lease_ttl_s",
                     "eval.every", "eval.batch_size", "eval.samples", "eval.pass_k", "eval.maj_k",
                     "eval.temperature", "mesh.", "distributed.", "model.offload_ref_params",
                     "model.share_prompt_forward", "grpo.micro_batch_size", "grpo.length_buckets",
                     "reward_timeout_s", "reward_isolation", "compile_cache_dir", "checkpoint.export_hf",
                     "env.step_timeout_s", "env.max_concurrent_steps")


def keys(config=None) -> list[str]:
  """Every key of the config (default: the base config), dotted, sections included."""
  out = []

  def walk(node, prefix):
    for key, value in node.items():
      out.append(prefix + key)
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, f"{prefix}{key}.")

  walk(get_config() if config is None else config, "")
  return out


def unknown_key_message(key: str) -> str:
  """One line for a key the config does not have, naming the closest keys."""
  import difflib
  sections = ("rewards", "reward_gates", "task.field_map", "task.options")  # name -> value maps, set whole
  known = [k for k in keys() if not isinstance(_get(get_config(), k), ml_collections.ConfigDict) or k in sections]
  leaf = key.rsplit(".", 1)[-1]
  close = [k for k in known if k.rsplit(".", 1)[-1] == leaf]  # the same name in another section
  close += [k for k in difflib.get_close_matches(key, known, n=3, cutoff=0.6) if k not in close]
  hint = f"; did you mean {' or '.join(f'config.{k}' for k in close[:3])}?" if close else ""
  return (f"config.{key}: no such key{hint} (every key and its default: docs/config.md)")


def saved_with_defaults(saved: dict) -> ml_collections.ConfigDict:
  """A saved config.json as a ConfigDict, with every field the run predates (e.g. a config group added later) at
  its default, so the code of today reads a run of yesterday (a key the code no longer has is kept, unread)."""
  config = get_config()
  free_form = {"rewards", "reward_gates", "task.field_map", "task.options"}  # name -> value maps: the saved one replaces ours

  def merge(target, values: dict, prefix: str):
    for key, value in values.items():
      if (isinstance(value, dict) and isinstance(target.get(key), ml_collections.ConfigDict)
          and prefix + key not in free_form):
        merge(target[key], value, f"{prefix}{key}.")
      else:
        with target.ignore_type():
          target[key] = value

  merge(config, saved, "")
  legacy = config.eval.get("pass_k")
  if isinstance(legacy, int):  # a run before eval.samples: pass_k = K was pass@K from K samples
    with config.eval.ignore_type():
      config.eval.samples, config.eval.pass_k = legacy, (legacy,) if legacy else ()
  return config


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and key not in ("rewards", "reward_gates", "field_map", "options"):
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
