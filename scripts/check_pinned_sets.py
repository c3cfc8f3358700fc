"""Checks that pip resolves the GPU and TPU pinned sets as written, for the nodes they serve (CPython 3.12, Linux
x86_64), from this CPU machine: nothing is installed.

  .venv/bin/python scripts/check_pinned_sets.py                       # both sets (needs PyPI, 1-3 minutes)
  .venv/bin/python scripts/check_pinned_sets.py constraints/tpu-py312.txt

For each set, `pip install --dry-run --report` resolves setup.cfg's requirements with the set's extras (what
`pip install -c SET -e ".[ray,cuda12]"` installs on a node) for Python 3.12 wheels, constrained by the set. The
set passes when pip finds a wheel for every package, every package it picks is pinned in the set at the version
picked, and every pin is used. Exit code 1 names what differs.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("ray_runtime_env", os.path.join(ROOT, "scripts", "ray_runtime_env.py"))
ray_runtime_env = importlib.util.module_from_spec(_spec)  # a sibling script: what reads setup.cfg and the sets
_spec.loader.exec_module(ray_runtime_env)
EXTRAS = {"constraints/gpu-py312.txt": ["ray", "cuda12"], "constraints/tpu-py312.txt": ["ray", "tpu"]}
# Linux x86_64 wheels a node can install (glibc 2.35: Ubuntu 22.04, the GPU and TPU VM images).
PLATFORMS = (*[f"manylinux_2_{minor}_x86_64" for minor in range(35, 4, -1)], "manylinux2014_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")


def resolve(set_path: str) -> dict[str, str]:
  """{normalized name: version} that pip picks for the set's nodes."""
  requirements = ray_runtime_env.declared(EXTRAS[set_path])
  with tempfile.TemporaryDirectory() as scratch:
    report = os.path.join(scratch, "report.json")
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
               report, "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi",
               "cp312", *[f"--platform={p}" for p in PLATFORMS], "-c", os.path.join(ROOT, set_path), *requirements]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
      raise SystemExit(f"{set_path}: pip could not resolve it:\n{done.stderr[-3000:]}")
    with open(report) as f:
      installs = json.load(f)["install"]
  return {ray_runtime_env._name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def differences(set_path: str, picked: dict[str, str]) -> list[str]:
  pinned = {name: line.split("==", 1)[1] for name, line in ray_runtime_env.pins(os.path.join(ROOT, set_path)).items()}
  out = [f"pip picks {name}=={version}, the set pins {pinned.get(name, 'nothing')}"
         for name, version in sorted(picked.items()) if pinned.get(name) != version]
  out += [f"{name}=={pinned[name]} is pinned but not installed" for name in sorted(pinned.keys() - picked.keys())]
  return out


def main(argv: list[str]) -> int:
  failed = 0
  for set_path in argv or sorted(EXTRAS):
    if set_path not in EXTRAS:
      print(f"check_pinned_sets: error: {set_path!r} is not one of {sorted(EXTRAS)}", file=sys.stderr)
      return 2
    picked = resolve(set_path)
    problems = differences(set_path, picked)
    failed += bool(problems)
    print(f"{set_path}: pip resolves {len(picked)} packages for CPython 3.12 on Linux x86_64"
          + ("; every one at its pinned version, every pin used" if not problems else ":\n  " + "\n  ".join(problems)))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
