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


def test_the_shape_glossaries_name_where_p_n_and_s_count_prompts_samples_and_seeds():
  # stats/ and train/evaluation.py name arrays [prompts, samples] and [seeds, prompts] (`correct_PxN`, `scores_SxP`)
  import grpo_jax
  with open(os.path.join(ROOT, "docs", "design.md")) as f:
    design = f.read().split("## Shape glossary")[1].split("\n## ")[0]
  users = set()
  for d, _, names in os.walk(os.path.join(ROOT, "grpo_jax")):
    for name in (n for n in names if n.endswith(".py")):
      with open(os.path.join(d, name)) as f:
        if re.search(r"\w_(PxN|SxP)\b", f.read()):
          users.add(os.path.relpath(os.path.join(d, name), os.path.join(ROOT, "grpo_jax")))
  assert users
  for glossary in (grpo_jax.__doc__, design):
    missing = {u for u in users if u not in glossary and os.path.dirname(u) + "/" not in glossary}
    assert not missing, f"the shape glossary does not say that P, N and S count prompts, samples, seeds in {missing}"


def test_the_algo_packages_index_names_every_module_of_it():
  import grpo_jax.algo
  indexed = set(re.findall(r"^\d+\. +`(\w+\.py)`", grpo_jax.algo.__doc__, flags=re.M))
  modules = {n for n in os.listdir(os.path.join(ROOT, "grpo_jax", "algo")) if n.endswith(".py") and n != "__init__.py"}
  assert indexed == modules, f"grpo_jax/algo/__init__.py's index: add {modules - indexed}, drop {indexed - modules}"
