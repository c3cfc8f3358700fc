#!/usr/bin/env python
"""Prints the Ray runtime environment that brings this package's dependencies to every node of a cluster.

  ray job submit --address http://HEAD:8265 --working-dir . \\
      --runtime-env-json "$(python scripts/ray_runtime_env.py --extras cuda12)" \\
      -- python scripts/sweep.py --config experiments/ablation_variants.py --sweep_dir /mnt/shared/av \\
         --backend=ray --ray_address=auto

`--working-dir .` uploads this repository (what .gitignore leaves out stays behind: .venv, runs, models) and
every task runs in it, so grpo_jax and scripts/train.py come from the same commit as the driver. `pip` lists the
package's install_requires and the chosen extras (setup.cfg), which Ray installs once per node into a virtualenv
layered over the node's Python. Needs only the standard library, so it runs before anything is installed.
"""
import argparse
import configparser
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def requirements(extras: list[str]) -> list[str]:
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(REPO, "setup.cfg"))
  known = cfg["options.extras_require"]
  unknown = [e for e in extras if e not in known]
  if unknown:
    print(f"ray_runtime_env.py: error: unknown extra(s) {unknown}; setup.cfg has {sorted(known)}", file=sys.stderr)
    sys.exit(2)
  lines = cfg["options"]["install_requires"].splitlines()
  for extra in extras:
    lines += known[extra].splitlines()
  return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--extras", default="ray", help="comma-separated extras of setup.cfg (default: ray)")
  parser.add_argument("--no_pip", action="store_true", help="nodes already have the packages: only the excludes")
  args = parser.parse_args(argv)
  extras = [e for e in args.extras.split(",") if e]
  env = {"excludes": [".git", ".venv", "runs", "models", "__pycache__"]}
  if not args.no_pip:
    env["pip"] = {"packages": requirements(extras), "pip_check": False}
  print(json.dumps(env))


if __name__ == "__main__":
  main()
