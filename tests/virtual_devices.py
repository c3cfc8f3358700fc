"""Work on N virtual CPU devices, in a fresh interpreter: XLA fixes the device count when JAX starts
(`--xla_force_host_platform_device_count`), so a test that needs a mesh runs its worker in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.xla_compiler import fast_flags

REPO = Path(__file__).resolve().parents[1]


def env_with_devices(n: int) -> dict[str, str]:
  """This process's environment with `n` virtual CPU devices and the repository importable (and the suite's fast
  compilation where this process has it: tests/xla_compiler.py)."""
  env = dict(os.environ, XLA_FLAGS=" ".join([f"--xla_force_host_platform_device_count={n}", *fast_flags()]),
             JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
  return env


def run_worker(script: Path, *args: str, devices: int = 8, timeout: float = 600) -> dict:
  """Runs `python script args...` on `devices` virtual CPU devices; returns the JSON object of its last
  stdout line (the worker prints its results there)."""
  proc = subprocess.run([sys.executable, str(script), *args], env=env_with_devices(devices), capture_output=True,
                        text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-5000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])
