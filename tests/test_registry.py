"""grpo_jax/registry.py: one mechanism for every named kind (losses, advantages, rewards, environments, tasks)."""
import pytest

from grpo_jax import registry as registry_lib
from grpo_jax.registry import Registry, same_definition


def _double(x):
  return 2 * x


def _triple(x):
  return 3 * x


def test_register_returns_the_object_and_get_finds_it():
  r = Registry("widget")
  assert r.register("double")(_double) is _double
  assert r.get("double") is _double
  assert "double" in r and "triple" not in r
  assert r.name_of(_double) == "double" and r.name_of(_triple) is None


def test_names_are_sorted_and_iteration_keeps_registration_order():
  r = Registry("widget")
  r.register("b")(_double)
  r.register("a")(_triple)
  assert r.names() == ["a", "b"]
  assert list(r) == ["b", "a"]
  assert len(r) == 2


def test_a_taken_name_needs_overwrite():
  r = Registry("widget")
  r.register("f")(_double)
  r.register("f")(_double)  # the same object again is fine
  with pytest.raises(ValueError, match="a widget named 'f' is already registered"):
    r.register("f")(_triple)
  assert r.get("f") is _double
  r.register("f", overwrite=True)(_triple)
  assert r.get("f") is _triple


def test_same_definition_replaces_silently():
  def make():
    def cell(x):
      return x
    return cell
  first, again = make(), make()
  assert first is not again and same_definition(first, again)
  assert not same_definition(_double, _triple)
  r = Registry("widget")
  r.register("cell")(first)
  r.register("cell")(again)  # a re-run notebook cell
  assert r.get("cell") is again


def test_bad_names_and_entries():
  r = Registry("widget")
  with pytest.raises(ValueError, match="widget name must be a non-empty string"):
    r.register("")
  with pytest.raises(TypeError, match="must be callable"):
    r.register("x")(3)


def test_objects_pass_through_only_where_allowed():
  assert Registry("widget", objects=True).get(_double) is _double
  with pytest.raises(ValueError, match="unknown widget"):
    Registry("widget").get(_double)


def test_import_paths_only_where_allowed():
  with_paths = Registry("widget", import_paths=True)
  assert with_paths.get("grpo_jax.registry:same_definition") is same_definition
  assert "grpo_jax.registry:same_definition" not in with_paths  # not registered
  with pytest.raises(ValueError, match="cannot import widget 'grpo_jax.registry:nope'"):
    with_paths.get("grpo_jax.registry:nope")
  with pytest.raises(ValueError, match="cannot import widget 'no_such_module_xyz:f'"):
    with_paths.get("no_such_module_xyz:f")
  with pytest.raises(TypeError, match="not callable"):
    with_paths.get("grpo_jax.registry:__doc__")
  with pytest.raises(ValueError, match="unknown widget 'grpo_jax.registry:same_definition'"):
    Registry("widget").get("grpo_jax.registry:same_definition")


def test_prefix_pattern_matches_names_with_its_prefix():
  r = Registry("task")
  r.register("plain")(_double)
  r.register("gym:<dataset>")(_triple)
  assert r.get("gym:leg_counting") is _triple
  assert "gym:anything" in r and "gym" not in r and "plain" in r
  assert r.names() == ["gym:<dataset>", "plain"]
  with pytest.raises(ValueError, match="unknown task 'gm:leg_counting'"):
    r.get("gm:leg_counting")


def test_unknown_name_error_names_kind_value_registered_and_closest():
  r = Registry("policy loss", objects=True)
  for name in ("clipped", "cispo", "reinforce"):
    r.register(name)(_double)
  with pytest.raises(ValueError) as e:
    r.get("clipd")
  message = str(e.value)
  assert message.startswith("unknown policy loss 'clipd', not one of ['cispo', 'clipped', 'reinforce'] or a function")
  assert message.endswith("; did you mean 'clipped' or 'cispo'?")  # closest first
  with pytest.raises(ValueError) as e:
    r.get("zzz")
  assert "did you mean" not in str(e.value)
  with pytest.raises(ValueError, match="unknown policy loss None"):
    r.get(None)


def test_builtins_module_is_imported_before_the_first_lookup(monkeypatch):
  imported = []
  r = Registry("widget", builtins="fake_builtin_widgets")

  def import_module(name):  # stands for a module whose import registers the built-ins
    imported.append(name)
    r.register("builtin")(_double)
  monkeypatch.setattr(registry_lib.importlib, "import_module", import_module)
  assert r.names() == ["builtin"]
  assert r.get("builtin") is _double and imported == ["fake_builtin_widgets"]  # imported once
  # A user's entry under a built-in name collides with it, even when registered before any lookup.
  r = Registry("widget", builtins="fake_builtin_widgets")
  with pytest.raises(ValueError, match="already registered"):
    r.register("builtin")(_triple)


def test_every_module_that_registers_a_plug_in_is_imported_when_the_registries_load():
  # Plug-ins register on import, and a package imports its plug-in modules by name (rewards/__init__.py,
  # data/tasks.py's BUILTIN_TASKS, the envs registry's builtins): a module left off those lists would register
  # nothing unless a user imported it. Loading every registry in a fresh process must import each one.
  import os
  import re
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  registering = set()
  for d, _, names in os.walk(os.path.join(root, "grpo_jax")):
    for name in (n for n in names if n.endswith(".py")):
      with open(os.path.join(d, name)) as f:
        if re.search(r'^\s*@(\w+\.)*register\w*\(|^[^#]*[^\w.]register_\w+\("', f.read(), re.M):
          registering.add(os.path.relpath(os.path.join(d, name[:-3]), root).replace(os.sep, "."))
  loaded = subprocess.run(
      [sys.executable, "-c", "import sys; from grpo_jax.train import checks\n"
       "for r in checks.registries().values(): r.names()\nprint(*sys.modules)"],
      capture_output=True, text=True, check=True, cwd=root, env={**os.environ, "PYTHONPATH": root}).stdout.split()
  assert len(registering) >= 15
  missing = sorted(registering - set(loaded))
  assert not missing, f"add these plug-in modules to their package's import list: {missing}"
