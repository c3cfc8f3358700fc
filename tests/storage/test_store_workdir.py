"""A run whose workdir is on a store (s3://, gs://), SIGKILLed and started again, ends equal to the same run on
local disk: final step, state fingerprint, data position, every logged metric but the timings, the warm-start
log. The killed run's lease (its pid gone) is taken back at once by the same command.

s3:// runs in the default suite (about 45 s with the compilation cache the first run fills); gs:// and the
other kill points with `pytest -m faults tests/storage/test_store_workdir.py`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from etils import epath

from grpo_jax import storage
from grpo_jax.persist.metrics import read_jsonl
from tests.train.conftest import ROOT
from tests.train.test_faults import _timing


def _run(workdir: str, cache_dir, env: dict, *point) -> subprocess.CompletedProcess:
  # TMPDIR under pytest's own: a SIGKILLed run cannot remove its local TensorBoard directory.
  env = dict(os.environ, **env, TMPDIR=str(cache_dir), JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  return subprocess.run([sys.executable, "-m", "tests.train.fault_runner", workdir, *map(str, point)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def outcome(workdir: str) -> tuple:
  """(final step, its state fingerprint, data position, metrics without timings, warm-start log)."""
  directory = storage.join(workdir, "checkpoints")
  step = max(int(d) for d in storage.listdir(directory) if d.isdigit())
  meta = json.loads(storage.read_text(storage.join(directory, str(step), "meta", "metadata")))
  metrics = [{k: v for k, v in r.items() if not _timing(k)}
             for r in read_jsonl(storage.join(workdir, "metrics.jsonl"))]
  return (step, meta["state_fingerprint"], meta["data_position"], metrics,
          read_jsonl(storage.join(workdir, "warmstart.jsonl")))


@pytest.fixture(scope="module")
def on_local_disk(tmp_path_factory, cache_dir):
  workdir = tmp_path_factory.mktemp("local")
  result = _run(str(workdir), cache_dir, {})
  assert result.returncode == 0, result.stderr[-3000:]
  return outcome(str(workdir))


CASES = [pytest.param("s3", "mid_checkpoint_save", 3, id="s3-mid_checkpoint_save-3"),
         pytest.param("gs", "during_async_write", 2, id="gs-during_async_write-2", marks=pytest.mark.faults),
         pytest.param("s3", "after_warmstart_save", 1, id="s3-after_warmstart_save-1", marks=pytest.mark.faults),
         pytest.param("gs", "mid_checkpoint_save", 3, id="gs-mid_checkpoint_save-3", marks=pytest.mark.faults)]


@pytest.mark.parametrize("scheme,point,nth", CASES)
def test_a_killed_run_on_a_store_resumes_equal_to_the_run_on_local_disk(scheme, point, nth, on_local_disk,
                                                                        cache_dir, request):
  store = request.getfixturevalue({"s3": "s3", "gs": "gcs"}[scheme])
  workdir = store.url("killed")
  killed = _run(workdir, cache_dir, store.env, point, nth)
  assert killed.returncode == -signal.SIGKILL, f"the kill point was not reached:\n{killed.stderr[-3000:]}"
  assert storage.exists(storage.join(workdir, ".lease"))  # left behind by the killed run
  resumed = _run(workdir, cache_dir, store.env)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "[lease] took over" in resumed.stdout and "is gone" in resumed.stdout
  step, fingerprint, position, metrics, warmstart_log = outcome(workdir)
  assert (step, position) == (on_local_disk[0], on_local_disk[2])
  assert fingerprint == on_local_disk[1]
  assert metrics == on_local_disk[3]
  assert warmstart_log == on_local_disk[4]
  assert storage.exists(storage.join(workdir, "summary.json"))
  assert any(name.startswith("events.out.tfevents") for name in storage.listdir(storage.join(workdir, "tensorboard")))
  assert not storage.exists(storage.join(workdir, ".lease"))  # released at the end
  if scheme == "s3":  # the other commands take the store's URL too
    _evaluate_and_export(workdir, metrics, cache_dir, store.env)
  epath.Path(workdir).rmtree(missing_ok=True)


def _evaluate_and_export(workdir: str, metrics: list[dict], cache_dir, env: dict) -> None:
  """grpo-evaluate reproduces the run's final held-out accuracy from the store; grpo-export writes a model there."""
  env = dict(os.environ, **env, TMPDIR=str(cache_dir),
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  final = [r["eval/accuracy"] for r in metrics if "eval/accuracy" in r][-1]
  done = subprocess.run([sys.executable, "scripts/evaluate.py", workdir, "--examples", "0"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"accuracy {final:.3f}" in done.stdout
  out = storage.join(workdir, "exported")
  done = subprocess.run([sys.executable, "scripts/export.py", workdir, out], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert {"config.json", "model.safetensors"} <= set(storage.listdir(out))
