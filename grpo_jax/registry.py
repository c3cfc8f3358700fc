"""Named entries of one kind (policy losses, advantage methods, KL estimators, aggregations, rewards, environments,
tasks): the one place that maps a config's name to the function or class it means, and the single source of the
allowed names for the config's validation and for docs/config.md.

    LOSSES = Registry("grpo.policy_loss", "policy loss", objects=True)

    @LOSSES.register("clipped")
    def clipped_surrogate(inputs, cfg): ...

    LOSSES.get("clipped")      # the function; LOSSES.get(fn) is fn itself (objects=True)
    LOSSES.names()             # sorted names

A registered name ending in "<...>" is a pattern: "reasoning_gym:<dataset>" stands for every name that starts with
"reasoning_gym:". With `import_paths=True`, `get` also resolves "package.module:attr".
Every registry is kept in REGISTRIES as it is created: the settings check and docs/config.md list them from there
(grpo_jax/train/checks.py's `registries`), so a new one needs no side list.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Iterator


def same_definition(a: Callable, b: Callable) -> bool:
  """True for two functions defined by the same code: same module and qualified name."""
  key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))
  return key(a) == key(b) and None not in key(a)  # an instance has its class's module but no qualified name


REGISTRIES: list[Registry] = []  # every Registry, in the order they were created


class Registry:
  """Names -> callables of one kind.

  key           the config key whose values name its entries ("grpo.policy_loss").
  kind          what an entry is, in messages ("policy loss"; default: the key).
  builtins      modules imported before the first lookup (a name or a tuple of names): their imports register the
                built-in entries (for entries defined in modules that import the registry themselves: plug-ins).
  objects       `get(fn)` returns a callable given instead of a name as it is.
  import_paths  `get` resolves "package.module:attr" too.
  """

  def __init__(self, key: str, kind: str | None = None, *, builtins: str | tuple[str, ...] = (),
               objects: bool = False, import_paths: bool = False):
    self.key, self.kind = key, kind or key
    self._builtins = (builtins,) if isinstance(builtins, str) else tuple(builtins)
    self._loading = False
    self._objects = objects
    self._import_paths = import_paths
    self._entries: dict[str, Callable] = {}
    REGISTRIES.append(self)

  def _load(self) -> None:
    if self._loading:  # a built-in module registering its entries: the others load after it
      return
    self._loading = True
    try:
      while self._builtins:
        importlib.import_module(self._builtins[0])
        self._builtins = self._builtins[1:]
    finally:
      self._loading = False

  def register(self, name: str, *, overwrite: bool = False) -> Callable[[Callable], Callable]:
    """Decorator that registers `obj` under `name` and returns it unchanged.

    A taken name raises ValueError unless `overwrite=True`, or the new entry is the same object or a function with
    the same module and qualified name (a reloaded module, a re-run notebook cell), which replaces it silently.
    """
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

    def decorator(obj: Callable) -> Callable:
      if not callable(obj):
        raise TypeError(f"a {self.kind} must be callable; {name!r} got {obj!r}")
      self._load()
      old = self._entries.get(name)
      if old is not None and old is not obj and not (overwrite or same_definition(old, obj)):
        raise ValueError(f"a {self.kind} named {name!r} is already registered ({old!r}); "
                         "pass overwrite=True to replace it")
      self._entries[name] = obj
      return obj

    return decorator

  def get(self, name: Any) -> Callable:
    """The entry called `name` (a registered name, a name a pattern matches, or an import path where allowed);
    with `objects=True` a callable is returned as is. ValueError for anything else."""
    if self._objects and callable(name):
      return name
    self._load()
    if isinstance(name, str):
      key = name if name in self._entries else self._pattern(name)
      if key is not None:
        return self._entries[key]
      if self._import_paths and ":" in name:
        return self._import(name)
    raise ValueError(self._unknown(name))

  def _pattern(self, name: str) -> str | None:
    """The pattern ("prefix<...>") that matches `name`, or None."""
    return next((key for key in self._entries
                 if key.endswith(">") and "<" in key and name.startswith(key[:key.index("<")])), None)

  def _import(self, path: str) -> Callable:
    module_name, _, attr = path.partition(":")
    try:
      obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"cannot import {self.kind} {path!r}: {e}") from e
    if not callable(obj):
      raise TypeError(f"{path!r} is not callable")
    return obj

  def _unknown(self, name: Any) -> str:
    names = self.names()
    alternatives = ["a function"] * self._objects + ["an import path 'package.module:name'"] * self._import_paths
    message = f"unknown {self.kind} {name!r}, not one of {names}" + "".join(f" or {a}" for a in alternatives)
    close = difflib.get_close_matches(name, names, n=3) if isinstance(name, str) else []
    return message + (f"; did you mean {' or '.join(map(repr, close))}?" if close else "")

  def names(self) -> list[str]:
    """Sorted registered names (patterns included, e.g. "reasoning_gym:<dataset>")."""
    self._load()
    return sorted(self._entries)

  def name_of(self, obj: Callable) -> str | None:
    """The first name `obj` itself is registered under, or None."""
    self._load()
    return next((name for name, entry in self._entries.items() if entry is obj), None)

  def __contains__(self, name: Any) -> bool:
    """A registered name or one a pattern matches (import paths are not looked up)."""
    self._load()
    return isinstance(name, str) and (name in self._entries or self._pattern(name) is not None)

  def __iter__(self) -> Iterator[str]:
    """The names in registration order."""
    self._load()
    return iter(list(self._entries))

  def __len__(self) -> int:
    self._load()
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Registry({self.key!r}, {self.names()})"
