"""SIGKILL, or SIGTERM / SIGINT, at many points of a run, then resume: the run ends bitwise identical to an
uninterrupted one (final parameters and optimizer state by checksum, every logged metric but the timings).
A signalled run stops by itself with exit code 75 and every step it logged saved.

Three kill points and two signal points run in the default suite; all of tests/train/fault_runner.py's
KILL_POINTS and SIGNAL_POINTS with `pytest -m faults tests/train/test_faults.py` (about 40 s per point on 2
cores)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from grpo_jax.errors import EXIT_PREEMPTED
from grpo_jax.persist.metrics import read_jsonl
from tests.train.conftest import ROOT
from tests.train.fault_runner import KILL_POINTS, SAMPLER_DEVICES_VARIABLE, SIGNAL_POINTS, STALENESS_VARIABLE

TIMING = {"step_time", "tokens_per_s"}  # and every timing/* key


def _timing(name: str) -> bool:
  return name in TIMING or name.startswith("timing/")
IN_DEFAULT_SUITE = {("after_warmstart_save", 1), ("mid_checkpoint_save", 3), ("during_async_write", 2)}
SIGNALS_IN_DEFAULT_SUITE = {("rollout", 4), ("reward", 5)}


def _run(workdir, cache_dir, *point, staleness: int = 0, sampler_devices: int = 0) -> subprocess.CompletedProcess:
  # The default backend (a GPU where there is one), with tests/conftest.py's XLA_FLAGS (deterministic GPU ops);
  # with a sampler on its own device, one more virtual CPU device for it.
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
             **{STALENESS_VARIABLE: str(staleness), SAMPLER_DEVICES_VARIABLE: str(sampler_devices)})
  if sampler_devices:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={1 + sampler_devices}"
  # A session of its own: a signal to the run's process group must not reach pytest.
  return subprocess.run([sys.executable, "-m", "tests.train.fault_runner", str(workdir), *map(str, point)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)


def _outcome(workdir) -> tuple:
  """(final step, its state checksum, data position, metrics without timings, warm-start log)."""
  directory = os.path.join(workdir, "checkpoints")
  step = max(int(d) for d in os.listdir(directory) if d.isdigit())
  with open(os.path.join(directory, str(step), "meta", "metadata")) as f:
    meta = json.load(f)
  metrics = [{k: v for k, v in r.items() if not _timing(k)} for r in read_jsonl(os.path.join(workdir,
                                                                                            "metrics.jsonl"))
             if "event" not in r]
  return step, meta["state_fingerprint"], meta["data_position"], metrics, read_jsonl(os.path.join(workdir,
                                                                                           "warmstart.jsonl"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  result = _run(workdir, cache_dir)
  assert result.returncode == 0, result.stderr[-3000:]
  return _outcome(workdir)


@pytest.mark.parametrize("point,nth", [
    pytest.param(p, n, marks=() if (p, n) in IN_DEFAULT_SUITE else pytest.mark.faults) for p, n in KILL_POINTS],
    ids=[f"{p}-{n}" for p, n in KILL_POINTS])
def test_a_killed_run_resumes_bitwise_identical(point, nth, uninterrupted, cache_dir, tmp_path):
  killed = _run(tmp_path, cache_dir, point, nth)
  assert killed.returncode == -signal.SIGKILL, f"the kill point was not reached:\n{killed.stderr[-3000:]}"
  resumed = _run(tmp_path, cache_dir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  step, checksum, position, metrics, warmstart_log = _outcome(tmp_path)
  assert (step, position) == uninterrupted[:1] + uninterrupted[2:3]
  assert checksum == uninterrupted[1]
  assert metrics == uninterrupted[3]
  assert warmstart_log == uninterrupted[4]


@pytest.mark.parametrize("point,nth,signal_name", [
    pytest.param(p, n, a, marks=() if (p, n) in SIGNALS_IN_DEFAULT_SUITE else pytest.mark.faults)
    for p, n, a in SIGNAL_POINTS], ids=[f"{p}-{n}-{a}" for p, n, a in SIGNAL_POINTS])
def test_a_signalled_run_saves_its_last_step_exits_75_and_resumes_bitwise_identical(
    point, nth, signal_name, uninterrupted, cache_dir, tmp_path):
  signalled = _run(tmp_path, cache_dir, point, nth, signal_name)
  assert signalled.returncode == EXIT_PREEMPTED, f"rc {signalled.returncode}:\n{signalled.stderr[-3000:]}"
  assert "[preempted] SIG" in signalled.stdout
  rows = read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
  events = [r for r in rows if "event" in r]
  if events:  # stopped while steps ran: every step it logged (log.every 1) is in its newest checkpoint
    saved = max(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
    assert events == [dict(events[0], step=saved, event="preempted")]
    assert max(r["step"] for r in rows if "event" not in r) == saved
    assert events[0]["signal"] == {"int": "SIGINT"}.get(signal_name, "SIGTERM")
  resumed = _run(tmp_path, cache_dir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  step, checksum, position, metrics, warmstart_log = _outcome(tmp_path)
  assert (step, checksum, position) == (uninterrupted[0], uninterrupted[1], uninterrupted[2])
  assert metrics == uninterrupted[3]
  assert warmstart_log == uninterrupted[4]


# Rollouts one step ahead (rollout.staleness 1), with the faults marker: a pending batch, sampled by the previous
# policy, is in every checkpoint after the first. (point, n, signal or "kill"); the signal during rollout 3 lands while step 2 samples
# step 3's batch, with step 2's batch pending.
AHEAD_POINTS = [("rollout", 3, "term"), ("update", 3, "term"), ("after_checkpoint_save", 2, "kill"),
                ("during_async_write", 2, "kill")]
AHEAD_IN_DEFAULT_SUITE = set()  # the default suite restores pending batches in tests/train/test_rollouts_ahead.py


@pytest.fixture(scope="module")
def uninterrupted_ahead(tmp_path_factory, cache_dir):
  workdir = tmp_path_factory.mktemp("uninterrupted_ahead")
  result = _run(workdir, cache_dir, staleness=1)
  assert result.returncode == 0, result.stderr[-3000:]
  return _outcome(workdir)


@pytest.mark.parametrize("point,nth,action", [
    pytest.param(p, n, a, marks=() if (p, n) in AHEAD_IN_DEFAULT_SUITE else pytest.mark.faults)
    for p, n, a in AHEAD_POINTS], ids=[f"{p}-{n}-{a}" for p, n, a in AHEAD_POINTS])
def test_with_rollouts_ahead_an_interrupted_run_resumes_bitwise_identical(point, nth, action, uninterrupted_ahead,
                                                                          cache_dir, tmp_path):
  stopped = _run(tmp_path, cache_dir, point, nth, *(() if action == "kill" else (action,)), staleness=1)
  expected = -signal.SIGKILL if action == "kill" else EXIT_PREEMPTED
  assert stopped.returncode == expected, f"rc {stopped.returncode}:\n{stopped.stderr[-3000:]}"
  resumed = _run(tmp_path, cache_dir, staleness=1)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _outcome(tmp_path) == uninterrupted_ahead
  staleness = [r["rollout/staleness"] for r in read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
               if "event" not in r and r["step"] > 0]
  assert staleness == [0, 1, 1, 1, 1, 1]

# All three with the faults marker: the default suite's SIGTERM and SIGKILL during the overlapped sampling (the
# rescue save, a resume overlapped or inline) are tests/train/test_partial_rollouts.py's stopped runs.
@pytest.mark.faults
@pytest.mark.parametrize("action", ["term", "term_stall", "kill"])
def test_with_the_sampler_on_its_own_device_an_interrupted_run_resumes_to_the_inline_run(action, uninterrupted_ahead,
                                                                                         cache_dir, tmp_path):
  """rollout.sampler_devices = 1 of 2: the third sampler call is batch 3's, on the sampler's device while update 2
  runs. A SIGTERM there saves at once, once update 2 is done, step 2 with batch 3's sampling policy and step 2's
  batch and metrics, whose hooks run when the run resumes ("term_stall": the sampling never ends, so only that
  save ends the process); a SIGKILL loses both (the last checkpoint is step 0). Either way the resumed run ends as
  the uninterrupted inline run does (overlapped equals inline: tests/train/test_rollouts_ahead.py)."""
  stopped = _run(tmp_path, cache_dir, "rollout", 3, *(() if action == "kill" else (action,)), staleness=1,
                 sampler_devices=1)
  assert stopped.returncode == (-signal.SIGKILL if action == "kill" else EXIT_PREEMPTED), stopped.stderr[-3000:]
  if action != "kill":
    assert "step 2 saved during the rollout of the next" in stopped.stdout + stopped.stderr
  resumed = _run(tmp_path, cache_dir, staleness=1, sampler_devices=1)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _outcome(tmp_path) == uninterrupted_ahead


@pytest.mark.faults
def test_sigterms_over_the_first_seconds_of_the_default_run_each_exit_75(tmp_path):
  # Imports, loading, the compiles, the warm start and the first steps: a signal during a compile once ended the
  # process with a segmentation fault (139) after it printed the preempted line, 5 times in 17, and one during
  # JAX's import killed it (-15). No compilation cache, so every try compiles.
  codes = []
  for i in range(20):
    delay = 0.2 + 0.57 * i  # 0.2 .. 11 s after the start
    proc = subprocess.Popen([sys.executable, "scripts/train.py", "--config", "experiments/default.py", "--workdir",
                             str(tmp_path / str(i))], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    codes.append((delay, proc.returncode, err[-300:] if proc.returncode not in (EXIT_PREEMPTED, 0) else ""))
  assert all(rc in (EXIT_PREEMPTED, 0) for _, rc, _ in codes), [c for c in codes if c[1] not in (EXIT_PREEMPTED, 0)]
