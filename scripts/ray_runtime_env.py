#!/usr/bin/env python
"""Prints the Ray runtime environment that brings this package's dependencies to every node of a cluster.

  ray job submit --address http://HEAD:8265 --working-dir . \\
      --runtime-env-json "$(python scripts/ray_runtime_env.py --extras ray,cuda12)" \\
      -- python scripts/sweep.py --config experiments/ablation_variants.py --sweep_dir /mnt/shared/av \\
         --backend=ray --ray_address=auto --member_resources='{"GPU": 1}'

`--working-dir .` uploads this repository and every task runs in it, so grpo_jax and scripts/train.py come from
the same commit as the driver. What stays behind: what .gitignore leaves out (Ray reads it) and `excludes`
(outputs and environments, also for a checkout without .gitignore). Ray refuses a working_dir whose zip reaches
its gRPC message size (512 MiB in Ray 2.60, RAY_max_grpc_message_size); this script stops with one line before
that, counting the files' sizes before compression.

`pip` installs an exact, pinned set once per node into a virtualenv layered over the node's Python: the nodes a
set targets are named by the extras. cuda12 (NVIDIA GPUs) and tpu (TPU VMs) run Python 3.12 with jax 0.11:
every line of constraints/gpu-py312.txt or constraints/tpu-py312.txt. Otherwise the nodes are CPUs like the
machine this repository is tested on (Python 3.11): the package's declared requirements and extras at
constraints.txt's versions. Needs only the standard library, so it runs before anything is installed.
"""
import argparse
import configparser
import fnmatch
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_SET = "constraints.txt"
# The extra that names the nodes -> the pinned set they install.
TARGET_SETS = {"cuda12": "constraints/gpu-py312.txt", "tpu": "constraints/tpu-py312.txt"}
# Outputs and environments that never travel with the code, whether or not .gitignore lists them (gitignore
# syntax, as Ray reads them: a leading "/" anchors a pattern at the repository's root).
EXCLUDES = [".git", ".venv", ".venv-*", "runs", "models", "checkpoints", "build", "wandb", "__pycache__",
            "*.egg-info", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", "/workdir*"]
RAY_UPLOAD_CAP = 512 * 1024 * 1024  # Ray's GCS_STORAGE_MAX_SIZE (its max gRPC message size) in Ray 2.60


def _fail(message: str) -> None:
  print(f"ray_runtime_env.py: error: {message}", file=sys.stderr)
  sys.exit(2)


def _name(requirement: str) -> str:
  """'ray[default]>=2.50,<3' -> 'ray'; names compared as pip does (case, '-', '_' and '.' alike)."""
  return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)).lower()


def declared(extras: list[str], root: str = REPO) -> list[str]:
  """setup.cfg's install_requires and the named extras (one requirement string each)."""
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(root, "setup.cfg"))
  known = cfg["options.extras_require"]
  unknown = [e for e in extras if e not in known]
  if unknown:
    _fail(f"unknown extra(s) {unknown}; setup.cfg has {sorted(known)}")
  lines = cfg["options"]["install_requires"].splitlines()
  for extra in extras:
    lines += known[extra].splitlines()
  return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def pins(path: str) -> dict[str, str]:
  """A constraints file's exact pins: normalized name -> 'name==version' as written."""
  out = {}
  with open(path) as f:
    for line in f:
      line = line.split("#", 1)[0].strip()
      if line:
        if "==" not in line:
          _fail(f"{os.path.relpath(path, REPO)}: {line!r} is not an exact pin (name==version)")
        out[_name(line)] = line
  return out


def target_set(extras: list[str]) -> str:
  """The pinned set of the nodes the extras name (a path relative to the repository)."""
  targets = [TARGET_SETS[e] for e in extras if e in TARGET_SETS]
  if len(targets) > 1:
    _fail(f"--extras {','.join(extras)} names nodes of two kinds; one job's nodes run one of {sorted(TARGET_SETS)}")
  if "cuda13" in extras:
    _fail("--extras cuda13: no pinned set for CUDA 13 nodes yet; use cuda12 (constraints/gpu-py312.txt), or "
          "--no_pip on nodes that have their packages")
  return targets[0] if targets else CPU_SET


def packages(extras: list[str], root: str = REPO) -> list[str]:
  """What `pip` installs on each node: exact versions only."""
  wanted = declared(extras, root)
  path = target_set(extras)
  pinned = pins(os.path.join(root, path))
  missing = [r for r in wanted if _name(r) not in pinned]
  if missing:
    _fail(f"{path} pins no version of {missing}; add them (tests/test_constraints.py)")
  if path != CPU_SET:
    return list(pinned.values())  # the whole set of these nodes, their own dependencies included
  # The CPU set also holds the tests' packages (torch, ...): only the declared requirements, keeping their extras.
  return [re.split(r"[<>=!~;,\s]", r, maxsplit=1)[0] + "==" + pinned[_name(r)].split("==", 1)[1] for r in wanted]


def _excluded(relpath: str) -> bool:
  parts = relpath.split(os.sep)
  return any(fnmatch.fnmatch(parts[0], pattern[1:]) if pattern.startswith("/") else
             any(fnmatch.fnmatch(part, pattern) for part in parts) for pattern in EXCLUDES)


def upload_files(root: str = REPO) -> list[str]:
  """The files (relative paths) `ray job submit --working-dir ROOT` with our excludes would upload: those git
  does not ignore, as Ray reads .gitignore, unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1 or ROOT is no checkout."""
  files = None
  if os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1":
    try:
      out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout
      files = [p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(root, p))]
    except (OSError, subprocess.CalledProcessError):
      files = None
  if files is None:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
      rel = os.path.relpath(dirpath, root)
      dirnames[:] = [d for d in dirnames if not _excluded(os.path.normpath(os.path.join(rel, d)))]
      files += [os.path.normpath(os.path.join(rel, f)) for f in filenames]
  return sorted(f for f in files if not _excluded(os.path.normpath(f)))


def check_upload_size(root: str = REPO) -> int:
  """Bytes the working_dir would upload; one line and exit 2 if that reaches Ray's cap."""
  cap = int(os.environ.get("RAY_max_grpc_message_size", RAY_UPLOAD_CAP))
  sizes: dict[str, int] = {}
  for f in upload_files(root):
    top = f.split(os.sep, 1)[0]
    sizes[top] = sizes.get(top, 0) + os.path.getsize(os.path.join(root, f))
  total = sum(sizes.values())
  if total >= cap:
    largest = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    _fail(f"the working directory would upload {total / 2**20:.0f} MiB ({largest}), over Ray's cap of "
          f"{cap / 2**20:.0f} MiB for a job's working_dir; move large outputs out of the checkout or list them in "
          ".gitignore")
  return total


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--extras", default="ray",
                      help="comma-separated extras of setup.cfg (default: ray); cuda12 or tpu pick those nodes' set")
  parser.add_argument("--no_pip", action="store_true", help="nodes already have the packages: only the excludes")
  args = parser.parse_args(argv)
  extras = [e for e in args.extras.split(",") if e]
  check_upload_size()
  env = {"excludes": list(EXCLUDES)}
  if not args.no_pip:
    env["pip"] = {"packages": packages(extras), "pip_check": False}
  print(json.dumps(env))


if __name__ == "__main__":
  main()
