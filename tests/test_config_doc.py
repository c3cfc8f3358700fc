"""docs/config.md is generated from grpo_jax/settings.py; it must list every key, and be regenerated when the code
changes (python scripts/config_reference.py)."""
import os
import re
import subprocess
import sys

from grpo_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_config_reference_is_up_to_date_and_documents_every_key():
  # PYTHONPATH: this checkout's grpo_jax, whichever copy the interpreter has installed.
  check = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "config_reference.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
  assert check.returncode == 0, check.stderr
  with open(os.path.join(ROOT, "docs", "config.md")) as f:
    rows = [line for line in f if line.startswith("| `")]
  documented = {line.split("`")[1]: line.rsplit("|", 2)[1].strip() for line in rows}
  c = config_lib.get_config()
  for key, value in c.items():
    if hasattr(value, "items") and key not in ("rewards", "reward_gates"):
      for sub in value:
        if key == "task" and sub in ("field_map", "options"):
          continue
        assert f"{key}.{sub}" in documented, f"{key}.{sub}"
    else:
      assert key in documented, key
  undocumented = sorted(k for k, meaning in documented.items() if not meaning)
  assert not undocumented, f"keys without a comment in grpo_jax/settings.py: {undocumented}"


def test_every_registry_is_listed_for_the_settings_check_and_this_page():
  # Every Registry of the package (found by importing each module that constructs one) must be among those that
  # importing grpo_jax.train.checks alone creates (what validate and scripts/config_reference.py see: a fresh
  # process), and its key's row of this page must list its names.
  import importlib
  from grpo_jax.registry import Registry
  found = {}
  for d, _, names in os.walk(os.path.join(ROOT, "grpo_jax")):
    for name in (n for n in names if n.endswith(".py")):
      with open(os.path.join(d, name)) as f:
        if "Registry(" not in f.read():
          continue
      module = importlib.import_module(os.path.relpath(os.path.join(d, name[:-3]), ROOT).replace(os.sep, "."))
      found.update({v.key: f"{module.__name__}.{k}" for k, v in vars(module).items() if isinstance(v, Registry)})
  listed = subprocess.run([sys.executable, "-c", "from grpo_jax.train import checks; print(*checks.registries())"],
                          capture_output=True, text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}).stdout.split()
  assert len(found) >= 8
  missing = sorted(f"{name} ({key})" for key, name in found.items() if key not in listed)
  assert not missing, f"importing grpo_jax.train.checks does not create these registries: {missing}"
  with open(os.path.join(ROOT, "docs", "config.md")) as f:
    page = f.read()
  unlisted = sorted(key for key in found if not re.search(rf"^\| `{re.escape(key)}` \|.*Registered: ", page, re.M))
  assert not unlisted, f"docs/config.md does not list the registered names of {unlisted}"
