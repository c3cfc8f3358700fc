"""The package's layers, checked: setup.cfg's import-linter contracts (the layers, a core that knows no task, no
import cycle), and grpo_jax's own modules imported at the top of a module, never inside a function: an import
inside a function is for an optional or heavy dependency only (ray, reasoning_gym, torch, wandb, ...)."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_import_linter_contracts_hold():
  # In a process of its own: import-linter's console keeps the stdout it first saw, which pytest closes.
  code = ("import sys; from importlinter.cli import lint_imports; "
          f"sys.exit(lint_imports(config_filename={os.path.join(ROOT, 'setup.cfg')!r}, no_cache=True))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout + result.stderr


def _imports_inside_functions(path: str) -> set[tuple[str, str]]:
  with open(os.path.join(ROOT, path)) as f:
    tree = ast.parse(f.read())
  found = set()
  for function in ast.walk(tree):
    if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for node in ast.walk(function):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "grpo_jax":
          found.add((path, node.module))
        elif isinstance(node, ast.Import):
          found.update((path, a.name) for a in node.names if a.name.split(".")[0] == "grpo_jax")
  return found


def test_grpo_jax_modules_are_imported_at_the_top_of_a_module():
  found = set()
  for directory, _, names in os.walk(os.path.join(ROOT, "grpo_jax")):
    for name in names:
      if name.endswith(".py"):
        found |= _imports_inside_functions(os.path.relpath(os.path.join(directory, name), ROOT))
  assert found == set(), "import these at the top of their modules"
