"""The Ray backend with the real trainer and real clusters, in one file so that its tests run one after another
(pytest-xdist --dist loadfile) rather than as competing Ray clusters: a study of four members two at once, one
of whose Ray worker dies, is retried by Ray and ends with the metrics and the report of the local backend; a two-host member on a two-node local cluster trains as
tests/distributed/test_multihost.py's two processes do; `ray job submit --working-dir . --runtime-env-json
"$(python scripts/ray_runtime_env.py)" -- python scripts/sweep.py ... --backend=ray` against a one-node cluster
started with `ray start --head` (the fake trainer stands in for scripts/train.py)."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from grpo_jax.ablation import progress, ray_backend, report, runner, spec, study  # noqa: E402
from tests.sweep.conftest import REPO  # noqa: E402

CONFIG = "experiments/default.py:test"
COMMON = {"log.plot": False, "log.tensorboard": False}
TIMING = {"step_time", "tokens_per_s"}  # and every timing/* key


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("timing/")} for r in rows]


def _trainer_pids(workdir):
  out = subprocess.run(["pgrep", "-f", f"train.py .*--workdir {workdir} "], capture_output=True, text=True)
  return [int(p) for p in out.stdout.split()]


def _parent(pid):
  with open(f"/proc/{pid}/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[1])


def _overlaps(sweep_dir, names, killed_at=None):
  """The most attempts of `names` that ran at the same time (from their attempts.jsonl start and end times; an
  attempt whose Ray worker was killed has no end row: it ended at `killed_at`)."""
  events = []
  for name in names:
    rows = runner.read_jsonl(os.path.join(sweep_dir, name, runner.ATTEMPTS))
    starts = [r["start"] for r in rows if "rc" not in r]
    ends = {r["start"]: r["start"] + r["wall_s"] for r in rows if "rc" in r}
    for start in starts:
      events += [(start, 1), (ends.get(start, killed_at), -1)]
  running = most = 0
  for _, change in sorted(events, key=lambda e: (e[0], e[1])):
    running += change
    most = max(most, running)
  return most


def _report_numbers(sweep_dir):
  """Each member's report row without its timings (wall time, steps per second); NaN (a metric never logged, e.g.
  KL with beta 0) as None, so that equal rows compare equal."""
  return {m.name: (m.group, m.status, {k: None if v != v else v for k, v in m.summary.items()
                                       if k not in ("wall_s", "steps_per_s")})
          for m in report.load_sweep_dir(sweep_dir)}


def test_a_study_of_four_members_two_at_once_survives_a_killed_worker_and_reports_as_the_local_backend(tmp_path):
  """Four tiny members, two at a time (one CPU each of two); the Ray worker of one is killed after its step-2
  checkpoint: Ray retries it, it resumes and ends with the metrics of an uninterrupted twin; the report of the
  study equals the local backend's for the same members, timings aside."""
  members = spec.validate([{"name": f"lr{lr}_seed{seed}", "overrides": {"num_steps": 5, "seed": seed,
                                                                         "optim.learning_rate": lr}}
                           for lr in (3e-4, 1e-3) for seed in (0, 1)])
  names = [m.name for m in members]
  sweep_dir = str(tmp_path / "ray")
  victim = os.path.join(sweep_dir, names[0])
  killed = []

  def kill_the_worker_after_the_step_2_checkpoint():
    deadline = time.time() + 600
    while time.time() < deadline and not killed:
      pids = _trainer_pids(victim)
      if os.path.isdir(os.path.join(victim, "checkpoints", "2")) and pids:
        worker = _parent(pids[0])
        os.kill(worker, signal.SIGKILL)  # the Ray worker running the member's task, as if its node died
        killed.append(time.time())
      time.sleep(0.1)

  watcher = threading.Thread(target=kill_the_worker_after_the_step_2_checkpoint, daemon=True)
  watcher.start()
  # The eight runs share one persistent compilation cache (the same programs: the later ones load them).
  common = {**COMMON, "compile_cache_dir": str(tmp_path / "xla")}
  outcomes = study.run_sweep(CONFIG, sweep_dir, backend="ray", members=members, common=common,
                             member_resources={"CPU": 1}, ray_init_kwargs={"num_cpus": 2}, echo=lambda *_: None)
  watcher.join(timeout=1)
  assert killed and outcomes == dict.fromkeys(names, "done")
  assert _overlaps(sweep_dir, names, killed[0]) == 2  # two at once, never more
  assert progress.read_member(sweep_dir, names[0]).attempts == 2
  with open(os.path.join(victim, "train.log")) as f:  # the second attempt resumed from a GRPO checkpoint
    assert re.search(r"\[resume\] restored step [24] ", f.read())
  local_dir = str(tmp_path / "local")
  assert study.run_sweep(CONFIG, local_dir, members=members, common=common, echo=lambda *_: None) == outcomes
  assert _metrics(victim) == _metrics(os.path.join(local_dir, names[0]))  # CPU: exactly
  assert _report_numbers(sweep_dir) == _report_numbers(local_dir)
  assert _overlaps(local_dir, names) == 1


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# As tests/distributed/test_multihost.py: data=2 spans the two processes, fsdp=2 the two devices of each.
MULTIHOST = {"warmstart.enabled": False, "eval.every": 100, "checkpoint.every": 100, "grpo.beta": 0.04,
             "num_steps": 3, "grpo.overlong_buffer": 3, **COMMON}


def test_a_two_host_member_runs_on_two_nodes_and_trains_as_one_process_does(tmp_path):
  from ray.cluster_utils import Cluster
  two_devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
  cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
  try:
    cluster.add_node(num_cpus=1)
    members = spec.validate([{"name": "two", "overrides": {"mesh.data": 2, "mesh.fsdp": 2}}])
    outcomes = ray_backend.run_sweep(
        members, config_spec=CONFIG, sweep_dir=str(tmp_path), train_cmd=None, common=MULTIHOST,
        resources=ray_backend.MemberResources.parse({"CPU": 1, "hosts": 2}), address=cluster.address,
        init_kwargs={"runtime_env": {"env_vars": two_devices}}, echo=lambda *_: None)
  finally:
    cluster.shutdown()
  two = os.path.join(tmp_path, "two")
  logs = [open(os.path.join(two, name)).read() for name in ("train.log", "train.1.log")]
  assert outcomes == {"two": "done"}, logs[0][-3000:] + logs[1][-3000:]
  # One process on each node (STRICT_SPREAD), process 0 the only writer.
  nodes = {r["node"] for r in runner.read_jsonl(os.path.join(two, runner.ATTEMPTS)) if "node" in r}
  assert len(nodes) == 1 and "[done]" in logs[0] and "[done]" not in logs[1]
  # The one-process, one-device reference of the same global batch.
  one = str(tmp_path / "one")
  subprocess.run([sys.executable, "scripts/train.py", "--config", CONFIG, "--workdir", one,
                  *(f"--config.{k}={spec.format_value(v)}" for k, v in MULTIHOST.items())],
                 cwd=REPO, check=True, capture_output=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  a, b = _metrics(two), _metrics(one)
  assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3]
  for x, y in zip(a[1:], b[1:]):
    for k in ("reward", "completions/mean_length", "frac_reward_zero_std"):
      assert x[k] == y[k], k
    for k in ("loss", "grad_norm", "kl"):
      assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-8), k


RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def test_ray_job_submit_runs_the_sweep_from_the_uploaded_working_dir(tmp_path, experiment_file):
  env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
  env.pop("RAY_ADDRESS", None)
  # Ports of our own: the defaults (8265, the job agent's 52365, 10001) may still be held by a Ray instance that
  # another test just stopped, and a job agent that cannot bind its port never comes up.
  gcs, dashboard, agent, client = (_free_port() for _ in range(4))
  subprocess.run([RAY, "start", "--head", "--num-cpus=2", f"--port={gcs}", "--dashboard-host=127.0.0.1",
                  f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={agent}",
                  f"--ray-client-server-port={client}"],
                 env=env, check=True, capture_output=True, timeout=120)
  try:
    runtime_env = subprocess.run([sys.executable, "scripts/ray_runtime_env.py"], cwd=REPO, check=True,
                                 capture_output=True, text=True).stdout
    assert "ray[default]" in runtime_env and "flax" in runtime_env  # the package's requirements and the extra
    sweep_dir = tmp_path / "sweep"
    submit = lambda: subprocess.run(  # noqa: E731
        [RAY, "job", "submit", f"--address=http://127.0.0.1:{dashboard}", "--working-dir", ".",
         "--runtime-env-json", runtime_env, "--", "python", "scripts/sweep.py", "--config", experiment_file,
         "--sweep_dir", str(sweep_dir), "--backend=ray", "--ray_address=auto", "--member_resources",
         '{"CPU": 1}', "--train_cmd", "python tests/sweep/fake_train.py", "--only", "seed0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    job = submit()
    for _ in range(30):  # `ray start` returns before the dashboard's job agent is up (more so on a busy machine)
      if "No available agent to submit job" not in job.stderr + job.stdout:
        break
      time.sleep(2)
      job = submit()
    if "Failed to connect to Ray cluster" in job.stdout + job.stderr:  # a GCS starved by a loaded machine, once
      job = submit()
  finally:
    subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)
  assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
  assert "[sweep] 2 members: 2 done" in job.stdout
  for name in ("grpo_seed0", "rloo_seed0"):
    with open(sweep_dir / name / "invocations_env.jsonl") as f:
      (row,) = [json.loads(line) for line in f]
    # The trainer ran from the copy of the repository the job uploaded, not from this checkout.
    assert "working_dir_files" in row["file"] and not row["file"].startswith(REPO + os.sep), row["file"]
