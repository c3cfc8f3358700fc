"""docs/design.md maps every module of the package in one line: a module added without its line fails here."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_module_is_in_the_design_map():
  with open(os.path.join(ROOT, "docs", "design.md")) as f:
    mapped = set(re.findall(r"^\| `(grpo_jax/[\w/]+\.py)` \|", f.read(), flags=re.M))
  modules = {os.path.relpath(os.path.join(d, name), ROOT) for d, _, names in os.walk(os.path.join(ROOT, "grpo_jax"))
             for name in names if name.endswith(".py")}
  assert modules - mapped == set(), f"add these modules to docs/design.md: {sorted(modules - mapped)}"
  assert mapped - modules == set(), f"docs/design.md maps modules that do not exist: {sorted(mapped - modules)}"
