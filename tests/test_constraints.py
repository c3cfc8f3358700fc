"""The pinned sets (constraints.txt for the CPU, constraints/*-py312.txt for GPU and TPU nodes) and what
scripts/ray_runtime_env.py makes of them: every requirement the package declares for a set's nodes is pinned
there, exactly, at a version its range allows; the runtime environment installs exact versions; the working
directory it uploads leaves outputs behind and stops with one line before Ray's size cap."""
import importlib.util
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("ray_runtime_env", os.path.join(ROOT, "scripts", "ray_runtime_env.py"))
runtime_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runtime_env)

# Each set and the extras its nodes install (the CPU set is the tests' environment: every extra but the
# accelerators').
SETS = {"constraints.txt": ["ray", "test", "math", "wandb", "gym", "tensorboard"],
        "constraints/gpu-py312.txt": ["ray", "cuda12"],
        "constraints/tpu-py312.txt": ["ray", "tpu"]}


def test_every_set_is_listed_here_and_reached_by_ray_runtime_env():
  on_disk = {"constraints.txt"} | {f"constraints/{f}" for f in os.listdir(os.path.join(ROOT, "constraints"))}
  assert on_disk == set(SETS)
  assert set(runtime_env.TARGET_SETS.values()) | {runtime_env.CPU_SET} == set(SETS)


@pytest.mark.parametrize("path", sorted(SETS))
def test_each_set_pins_every_declared_requirement_at_an_allowed_version(path):
  pinned = runtime_env.pins(os.path.join(ROOT, path))  # exact pins only, or it stops
  for line in runtime_env.declared(SETS[path]):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"python_version": "3.12" if "py312" in path else "3.11"}):
      continue
    name = runtime_env._name(line)
    assert name in pinned, f"{path} pins no version of {req.name} ({line}, setup.cfg)"
    version = pinned[name].split("==", 1)[1]
    assert req.specifier.contains(version, prereleases=True), f"{path}: {pinned[name]} is outside {line}"
  for extra in SETS[path]:  # the extras' own packages (jax[cuda12] -> the CUDA plugin, jax[tpu] -> libtpu)
    wanted = {"cuda12": "jax-cuda12-plugin", "tpu": "libtpu"}.get(extra)
    assert wanted is None or wanted in pinned, f"{path}: {extra} nodes need {wanted}"


def test_gpu_and_tpu_nodes_run_jax_0_11_and_the_same_versions_elsewhere():
  gpu, tpu = (runtime_env.pins(os.path.join(ROOT, p))
              for p in ("constraints/gpu-py312.txt", "constraints/tpu-py312.txt"))
  cpu = runtime_env.pins(os.path.join(ROOT, "constraints.txt"))
  for pinned in (gpu, tpu):
    assert (pinned["jax"], pinned["jaxlib"], pinned["flax"]) == ("jax==0.11.2", "jaxlib==0.11.2", "flax==0.12.10")
    assert pinned["ray"] == cpu["ray"]  # one Ray across the cluster and the machine that submits
  assert {k: v for k, v in gpu.items() if k in tpu} == {k: v for k, v in tpu.items() if k in gpu}


def test_the_runtime_environment_installs_the_set_of_the_nodes_it_targets():
  for extra, path in (("cuda12", "constraints/gpu-py312.txt"), ("tpu", "constraints/tpu-py312.txt")):
    assert runtime_env.packages(["ray", extra]) == list(runtime_env.pins(os.path.join(ROOT, path)).values())
  cpu = runtime_env.packages(["ray"])
  assert "ray[default]==2.60.0" in cpu and "jax==0.10.2" in cpu and all("==" in p for p in cpu)
  assert not any(p.startswith("torch") for p in cpu)  # the CPU set's test-only packages stay behind


def _cli(*args, env=None):
  return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "ray_runtime_env.py"), *args], cwd=ROOT,
                        capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)


def test_mistakes_are_one_line():
  for args, says in ((["--extras", "ray,cuda13"], "no pinned set for CUDA 13 nodes"),
                     (["--extras", "ray,cuda12,tpu"], "names nodes of two kinds"),
                     (["--extras", "ray,nope"], "unknown extra(s) ['nope']")):
    out = _cli(*args)
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("ray_runtime_env.py: error: ") and says in out.stderr


def test_outputs_stay_behind_and_an_upload_over_rays_cap_is_one_line(tmp_path):
  for path in ("scripts/a.py", "runs/av/m/metrics.jsonl", ".venv/bin/python", "x/checkpoints/3/state",
               "models/q/model.safetensors", "workdir2/log", "grpo_jax/persist/workdir.py", "pkg.egg-info/PKG-INFO"):
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text("x" * 10)
  env = {"RAY_RUNTIME_ENV_IGNORE_GITIGNORE": "1"}  # no checkout here: the excludes alone decide
  with pytest.MonkeyPatch.context() as patch:
    for k, v in env.items():
      patch.setenv(k, v)
    assert runtime_env.upload_files(str(tmp_path)) == ["grpo_jax/persist/workdir.py", "scripts/a.py"]
  out = _cli(env={"RAY_max_grpc_message_size": str(2**20)})  # this checkout is several MiB
  assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert "over Ray's cap of 1 MiB for a job's working_dir" in out.stderr and "data " in out.stderr
  assert _cli().returncode == 0  # under the real cap (512 MiB)
