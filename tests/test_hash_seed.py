"""The launchers' hash seed (grpo_jax/hash_seed.py): every launch hashes strings alike, so data is repeatable."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRINT_HASH = """
import sys
if {pin}:
  from grpo_jax import hash_seed
  hash_seed.pin()
print(hash("grpo_jax"), sys.argv[1:])
"""


def _run(tmp_path, *, pin: bool, hash_seed: str | None, code: str = PRINT_HASH) -> str:
  script = tmp_path / "print_hash.py"
  script.write_text(code.format(pin=pin))
  env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
  if hash_seed is not None:
    env["PYTHONHASHSEED"] = hash_seed
  out = subprocess.run([sys.executable, "-u", str(script), "--an", "argument"], env=env, capture_output=True,
                       text=True, timeout=120, check=True)
  return out.stdout.strip()


def test_without_the_pin_two_processes_hash_differently(tmp_path):
  """The premise: Python salts str hashes per process (were this false, the pin would be needless)."""
  assert _run(tmp_path, pin=False, hash_seed=None) != _run(tmp_path, pin=False, hash_seed=None)


def test_pin_gives_every_process_hash_seed_zero_and_keeps_the_arguments(tmp_path):
  first, second = _run(tmp_path, pin=True, hash_seed=None), _run(tmp_path, pin=True, hash_seed=None)
  assert first == second == _run(tmp_path, pin=False, hash_seed="0")
  assert first.endswith("['--an', 'argument']")


def test_an_explicit_hash_seed_wins(tmp_path):
  assert _run(tmp_path, pin=True, hash_seed="7") == _run(tmp_path, pin=False, hash_seed="7") != \
      _run(tmp_path, pin=False, hash_seed="0")


@pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="needs the gym extra (reasoning-gym)")
def test_isomorphic_strings_questions_are_the_same_in_every_pinned_process(tmp_path):
  """reasoning-gym 0.1.25's isomorphic_strings orders a set of strings: pinned, two launches see one data set."""
  code = PRINT_HASH.replace('print(hash("grpo_jax"), sys.argv[1:])',
                            "import reasoning_gym\n"
                            "print([x['question'] for x in reasoning_gym.create_dataset('isomorphic_strings', "
                            "seed=3, size=8)])")
  assert _run(tmp_path, pin=True, hash_seed=None, code=code) == _run(tmp_path, pin=True, hash_seed=None, code=code)
  assert _run(tmp_path, pin=False, hash_seed="1", code=code) != _run(tmp_path, pin=False, hash_seed="2", code=code)


def _jax_modules_after_importing(module: str) -> str:
  probe = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'jax'))"
  return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                        check=True).stdout.strip()


def test_the_commands_that_import_jax_pin_the_seed_before_they_import_it():
  """grpo-train and grpo-evaluate (and scripts/train.py, scripts/evaluate.py) start in grpo_jax/commands/launch.py,
  which imports no JAX: the re-execution that pins the seed then costs one interpreter start, not JAX's import."""
  import configparser
  setup = configparser.ConfigParser()
  setup.read(os.path.join(ROOT, "setup.cfg"))
  scripts = dict(line.split(" = ") for line in setup["options.entry_points"]["console_scripts"].split("\n") if line)
  assert scripts["grpo-train"] == "grpo_jax.commands.launch:train"
  assert scripts["grpo-evaluate"] == "grpo_jax.commands.launch:evaluate"
  for name in ("train", "evaluate"):
    with open(os.path.join(ROOT, "scripts", f"{name}.py")) as f:
      assert f"from grpo_jax.commands.launch import {name}\n" in f.read()
  assert _jax_modules_after_importing("grpo_jax.commands.launch") == "[]"


def test_the_sweep_driver_imports_no_jax():
  """grpo-sweep pins the seed after its imports (grpo_jax/commands/sweep.py), and they hold no JAX: a driver, and
  each `ray job submit` of one, starts in a fifth of a second rather than half a second more."""
  assert _jax_modules_after_importing("grpo_jax.commands.sweep") == "[]"
