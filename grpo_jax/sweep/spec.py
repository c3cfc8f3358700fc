"""Sweep specifications: named members, each a set of config overrides, and how they become trainer commands.

An experiment file that wants a sweep defines, next to `get_config()`:

    def get_sweep():
      return [{"name": "grpo_seed0", "group": "grpo", "overrides": {"algo.advantage": "grpo", "seed": 0}}, ...]

A member is a dict with
  name       a unique directory name (letters, digits, `_ . = + -`); the member's workdir is SWEEP_DIR/<name>,
  overrides  {dotted config key: value}; each becomes `--config.<key>=<value>` on the trainer's command line.
             Values are bool, int, float or str (ml_collections cannot set a field to None from the command line),
  group      optional: the report averages members of one group (over seeds). Default: the name without a
             trailing `_seed<N>`.
  init_from  optional: the name of an EARLIER member whose warm-started starting point (the trainer's
             warmstart/ directory, passed as `warmstart.init_checkpoint`) this member starts from instead of
             repeating the warm start; see `runner.init_overrides` for when that is exact. `share_warm_start`
             sets it.
`axis`, `grid` and `variants` build such lists (cartesian products of labelled options, times seeds).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import re
import sys
from typing import Any, Iterable, Mapping, Sequence

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SEED_SUFFIX_RE = re.compile(r"_seed(\d+)$")

# An option of an axis: a label (used in member names) and the overrides it stands for.
Option = tuple[str, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Member:
  """One run of a sweep."""
  name: str
  overrides: dict[str, Any]
  group: str
  init_from: str | None = None

  def to_json(self) -> dict[str, Any]:
    out = {"name": self.name, "group": self.group, "overrides": dict(self.overrides)}
    if self.init_from:
      out["init_from"] = self.init_from
    return out


def default_group(name: str) -> str:
  """The group of a member named like `grpo_token_mean_seed2` is `grpo_token_mean`."""
  return _SEED_SUFFIX_RE.sub("", name)


def axis(key: str, values: Sequence[Any] | Mapping[str, Any]) -> list[Option]:
  """Options that set one config key: a list of values (labelled by str(value)) or a {label: value} dict."""
  items = values.items() if isinstance(values, Mapping) else ((_label(v), v) for v in values)
  return [(label, {key: value}) for label, value in items]


def variants(options: Mapping[str, Mapping[str, Any]]) -> list[Option]:
  """Options that each set several keys at once, e.g. {"dapo": {"grpo.beta": 0.0, "grpo.epsilon_high": 0.28}}."""
  return [(label, dict(overrides)) for label, overrides in options.items()]


def grid(*axes: Sequence[Option], seeds: Iterable[int] = (0,), seed_key: str = "seed", prefix: str = "",
         common: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
  """Cartesian product of the axes' options, times seeds, as a list of member dicts.

  The name joins `prefix` and the option labels with `_` and ends in `_seed<N>`; the group is the name without
  the seed. `common` overrides are applied to every member; an axis that sets a key already set by `common` or by
  another axis is an error (the product would silently depend on the axis order).
  """
  seeds = list(seeds)
  if not seeds:
    raise ValueError("grid needs at least one seed")
  members = []
  for combo in itertools.product(*axes):
    overrides = dict(common or {})
    for label, option_overrides in combo:
      clash = sorted(set(overrides) & set(option_overrides))
      if clash:
        raise ValueError(f"option {label!r} sets {clash}, already set by `common` or another axis")
      overrides.update(option_overrides)
    if seed_key in overrides:
      raise ValueError(f"{seed_key!r} is set by an axis or `common`; pass seeds=... instead")
    group = "_".join([prefix] * bool(prefix) + [label for label, _ in combo]) or "run"
    for seed in seeds:
      members.append({"name": f"{group}_seed{seed}", "group": group,
                      "overrides": {**overrides, seed_key: seed}})
  return members


def seed_of(name: str) -> int | None:
  match = _SEED_SUFFIX_RE.search(name)
  return int(match.group(1)) if match else None


def order_by_seed(members: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Seed 0 of every group first, then seed 1, ...: a sweep stopped early has every group at some seeds."""
  return sorted(members, key=lambda m: seed_of(m["name"]) or 0)  # a stable sort: file order within a seed


def share_warm_start(members: Sequence[dict[str, Any]], donor_group: str,
                     exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
  """Sets `init_from` of each member to the member of `donor_group` with the same seed, and moves the donors
  first (see the module docstring). Members of the groups in `exclude` (e.g. those whose checkpoint holds
  different state, like a reference model when β > 0) keep their own warm start."""
  exclude = set(exclude)
  donors = {seed_of(m["name"]): m["name"] for m in members if m.get("group", default_group(m["name"])) == donor_group}
  if not donors:
    raise ValueError(f"no member is in donor group {donor_group!r}")
  out = [dict(m) for m in members if m["name"] in donors.values()]
  for m in [dict(m) for m in members if m["name"] not in donors.values()]:
    if m.get("group", default_group(m["name"])) not in exclude:
      seed = seed_of(m["name"])
      if seed not in donors:
        raise ValueError(f"member {m['name']!r} has no donor in group {donor_group!r} with seed {seed}")
      m["init_from"] = donors[seed]
    out.append(m)
  return out


def _label(value: Any) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def validate(raw_members: Any) -> list[Member]:
  """Checks a `get_sweep()` result and turns it into Members; errors name the offending member and field."""
  if not isinstance(raw_members, (list, tuple)):
    raise TypeError(f"get_sweep() must return a list of member dicts, got {type(raw_members).__name__}")
  if not raw_members:
    raise ValueError("get_sweep() returned no members")
  members, seen = [], set()
  for i, raw in enumerate(raw_members):
    where = f"sweep member {i}"
    if not isinstance(raw, Mapping):
      raise TypeError(f"{where} must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"name", "overrides", "group", "init_from"})
    if unknown:
      raise ValueError(f"{where} has unknown fields {unknown}; allowed: name, overrides, group, init_from")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
      raise ValueError(f"{where} has name {name!r}: it must match {_NAME_RE.pattern} (it is a directory name)")
    where = f"sweep member {name!r}"
    if name in seen:
      raise ValueError(f"{where} appears twice: member names must be unique")
    seen.add(name)
    overrides = raw.get("overrides", {})
    if not isinstance(overrides, Mapping):
      raise TypeError(f"{where}: overrides must be a dict, got {type(overrides).__name__}")
    for key, value in overrides.items():
      if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"{where}: override key {key!r} is not a dotted config path like 'grpo.beta'")
      if not isinstance(value, (bool, int, float, str)):
        raise TypeError(f"{where}: override {key}={value!r} has type {type(value).__name__}; "
                        "use bool, int, float or str")
    group = raw.get("group", default_group(name))
    if not isinstance(group, str) or not group:
      raise ValueError(f"{where}: group must be a non-empty string, got {group!r}")
    init_from = raw.get("init_from")
    if init_from is not None and init_from not in seen - {name}:
      raise ValueError(f"{where}: init_from={init_from!r} is not the name of an earlier member")
    members.append(Member(name=name, overrides=dict(overrides), group=group, init_from=init_from))
  return members


def load_module(config_spec: str):
  """The experiment file of `config_spec` (`path.py` or `path.py:preset`), imported."""
  path = config_spec.partition(":")[0]
  if not os.path.isfile(path):
    raise FileNotFoundError(f"experiment file {path!r} does not exist")
  module_spec = importlib.util.spec_from_file_location("_grpo_jax_sweep_experiment", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def sibling_experiment(this_file: str, name: str):
  """The experiment file `name` in `this_file`'s folder, imported: for an experiment that starts from another's
  config (`sibling_experiment(__file__, "default.py").get_config(preset)`) and changes what differs."""
  return load_module(os.path.join(os.path.dirname(os.path.abspath(this_file)), name))


def load_sweep(config_spec: str, check_keys: bool = False, common: Mapping[str, Any] | None = None) -> list[Member]:
  """Imports the experiment file of `config_spec` (`path.py` or `path.py:preset`) and validates `get_sweep()`.
  With `check_keys`, every override (the members' and the sweep-wide `common`, --set) must also name an existing
  field of the file's `get_config([preset])`."""
  path, _, preset = config_spec.partition(":")
  module = load_module(config_spec)
  if not hasattr(module, "get_sweep"):
    raise AttributeError(f"{path} defines no get_sweep(); see grpo_jax/sweep/spec.py for the format")
  members = validate(module.get_sweep())
  if check_keys:
    config = module.get_config(preset) if preset else module.get_config()
    for member in members:
      check_keys_exist(config, member.overrides, f"sweep member {member.name!r}")
    check_keys_exist(config, common or {}, "--set")
  return members


def check_keys_exist(config, overrides: Mapping[str, Any], where: str) -> None:
  """Each dotted key must be a field of `config` (a ConfigDict or nested dicts), and a value must not change a
  field's kind (bool / number / str); None-valued fields (placeholders) take any value. Catches a misspelt key
  before a whole sweep of runs fails on it."""
  for key, value in overrides.items():
    node = config
    for i, part in enumerate(key.split(".")):
      try:
        node = node[part]
      except (KeyError, TypeError, AttributeError):
        prefix = ".".join(key.split(".")[:i]) or "the config"
        raise KeyError(f"{where}: override {key!r}: {prefix} has no field {part!r}") from None
    if node is None or (hasattr(node, "items") and isinstance(value, str)):
      continue   # a map field (task.options) takes a dict literal, which the trainer's command line parses
    if _kind(node) != _kind(value):
      raise TypeError(f"{where}: override {key}={value!r} is a {_kind(value)}, but the field is a {_kind(node)} "
                      f"({node!r})")


def _kind(value: Any) -> str:
  if isinstance(value, bool):
    return "bool"
  return "number" if isinstance(value, (int, float)) else type(value).__name__


def select(members: Sequence[Member], only: str | None) -> list[Member]:
  """Members whose name matches the regex `only` (re.search); all of them when `only` is None."""
  if only is None:
    return list(members)
  pattern = re.compile(only)
  chosen = [m for m in members if pattern.search(m.name)]
  if not chosen:
    raise ValueError(f"--only {only!r} matches none of the {len(members)} members "
                     f"(e.g. {', '.join(m.name for m in members[:3])})")
  return chosen


def merge_overrides(common: Mapping[str, Any], member: Member) -> dict[str, Any]:
  """Sweep-wide overrides (e.g. a shorter run for everyone) plus the member's; a key set by both is an error."""
  clash = sorted(set(common) & set(member.overrides))
  if clash:
    raise ValueError(f"--set {clash} clashes with member {member.name!r}'s own overrides")
  return {**common, **member.overrides}


def format_value(value: Any) -> str:
  """The command-line text ml_collections parses back into `value` (bools as true/false, floats exactly)."""
  return repr(value) if isinstance(value, float) else _label(value)


def default_train_cmd() -> list[str]:
  """The trainer of every member unless told otherwise: this Python running `grpo-train` by module, so the
  package it imports is the one this Python sees (on a Ray node, the job's working directory)."""
  return [sys.executable, "-m", "grpo_jax.commands.train"]


def train_command(train_cmd: Sequence[str], config_spec: str, workdir: str,
                  overrides: Mapping[str, Any]) -> list[str]:
  """argv of one trainer run: `<train_cmd> --config SPEC --workdir DIR --config.k=v ...`."""
  return [*train_cmd, "--config", config_spec, "--workdir", workdir,
          *(f"--config.{key}={format_value(value)}" for key, value in overrides.items())]
