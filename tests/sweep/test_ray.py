"""The Ray backend on a local Ray instance (small CPU resources; GPUs are Ray's logical resources here)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from grpo_jax.sweep import progress, ray_backend, runner, spec  # noqa: E402
from grpo_jax.errors import UserError  # noqa: E402
from grpo_jax.persist.layout import RunFiles  # noqa: E402
from tests.sweep.conftest import REPO  # noqa: E402

CPU1 = ray_backend.MemberResources.parse({"CPU": 1})
# A local instance of two CPUs; no tests here read Ray's dashboard (it costs each instance ~2.6 cpu-s to start).
LOCAL = {"num_cpus": 2, "include_dashboard": False}


def _rows(workdir, name="metrics.jsonl"):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def _run(members, sweep_dir, train_cmd, **kwargs):
  kwargs.setdefault("resources", CPU1)
  kwargs.setdefault("init_kwargs", LOCAL)
  return ray_backend.run_members(members, config_spec="exp.py", sweep_dir=str(sweep_dir), train_cmd=train_cmd,
                               poll_s=0.2, echo=lambda *_: None, **kwargs)


def test_same_files_as_the_local_backend_retries_crashes_and_fails_user_errors_once(tmp_path, fake_train_cmd):
  members = spec.validate([
      {"name": "a_seed0", "overrides": {"num_steps": 3}},
      {"name": "b_seed0", "overrides": {"num_steps": 3}, "init_from": "a_seed0"},
      {"name": "crash_seed0", "overrides": {"num_steps": 4, "crash_at": 2}},
      {"name": "broken", "overrides": {"fail": True}},
      {"name": "bad_key", "overrides": {"config_error": True}}])
  outcomes = _run(members, tmp_path / "ray", fake_train_cmd, max_attempts=3)
  local = runner.run_members(members, config_spec="exp.py", sweep_dir=str(tmp_path / "local"),
                           train_cmd=fake_train_cmd, max_attempts=3, echo=lambda *_: None)
  assert outcomes == local == {"a_seed0": "done", "b_seed0": "done", "crash_seed0": "done", "broken": "failed",
                               "bad_key": "failed"}
  # b_seed0 shares a_seed0's warm start: the two run at once here, and b_seed0 waits for it (runner.wait_for_donor);
  # the local backend ran a_seed0 first. Only the donor's path differs.
  for name in outcomes:
    a, b = tmp_path / "ray" / name, tmp_path / "local" / name
    assert sorted(os.listdir(a)) == sorted(os.listdir(b)), name
    same_place = [[arg.replace(str(tmp_path / "local"), str(tmp_path / "ray")) for arg in r]
                  for r in _rows(b, "invocations.jsonl")]
    assert _rows(a, "invocations.jsonl") == same_place
  assert f"--config.warmstart.init_checkpoint={tmp_path / 'ray' / 'a_seed0'}" in _rows(
      tmp_path / "ray" / "b_seed0", "invocations.jsonl")[0]
  # The crash was retried and resumed at its checkpoint: the history is that of an uninterrupted run.
  assert [r["step"] for r in _rows(tmp_path / "ray" / "crash_seed0")] == [0, 1, 2, 3, 4]
  assert _rows(tmp_path / "ray" / "crash_seed0") == _rows(tmp_path / "local" / "crash_seed0")
  # A crash is retried up to max_attempts; a user error (exit code 2) fails at its first attempt.
  attempts = {n: progress.read_member(str(tmp_path / "ray"), n).attempts for n in outcomes}
  assert attempts == {"a_seed0": 1, "b_seed0": 1, "crash_seed0": 2, "broken": 3, "bad_key": 1}
  failed = runner.read_json(str(tmp_path / "ray" / "bad_key" / "FAILED"))
  assert failed["rc"] == 2 and "a user error for the test" in failed["error"]
  # Started again, finished members are skipped without a task.
  again = _run(members[:1], tmp_path / "ray", fake_train_cmd)
  assert again == {"a_seed0": "skipped-done"} and len(_rows(tmp_path / "ray" / "a_seed0", "invocations.jsonl")) == 1


def test_members_run_at_once_each_on_its_own_gpu(tmp_path, fake_train_cmd):
  members = spec.validate([{"name": f"m{i}", "overrides": {"num_steps": 2, "sleep": 2.0}} for i in range(2)])
  outcomes = _run(members, tmp_path, fake_train_cmd, resources=ray_backend.MemberResources.parse({"GPU": 1}),
                  init_kwargs={**LOCAL, "num_gpus": 2})
  assert outcomes == {"m0": "done", "m1": "done"}
  (a,), (b,) = (_rows(tmp_path / m, "invocations_env.jsonl") for m in ("m0", "m1"))
  assert {a["CUDA_VISIBLE_DEVICES"], b["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
  assert a["start"] < b["end"] and b["start"] < a["end"]  # they ran at the same time


def test_member_resources_parse_and_defaults():
  r = ray_backend.MemberResources.parse('{"TPU": 4, "hosts": 2}')
  assert (dict(r.per_host), r.hosts) == ({"TPU": 4, "CPU": 1}, 2)
  assert r.task_options() == {"num_cpus": 1, "resources": {"TPU": 4}}
  assert ray_backend.MemberResources.parse({"GPU": 1, "CPU": 4}).task_options() == {"num_cpus": 4, "num_gpus": 1}
  for bad in ("GPU", "{}", '{"GPU": 0}', '{"hosts": 0, "CPU": 1}', '{"GPU": "one"}'):
    with pytest.raises(UserError, match="--member_resources"):
      ray_backend.MemberResources.parse(bad)
  assert ray_backend.default_resources([{"CPU": 16, "GPU": 8}]).per_host == {"CPU": 1, "GPU": 1}
  assert ray_backend.default_resources([{"CPU": 96, "TPU": 4}]).per_host == {"CPU": 1, "TPU": 4}
  assert ray_backend.default_resources([{"CPU": 8}, {"CPU": 4}]).per_host == {"CPU": 4}
  env = ray_backend.visible_devices_env({"A": "1"}, {"GPU": ["3", "5"], "TPU": []})
  assert env == {"A": "1", "CUDA_VISIBLE_DEVICES": "3,5"}


def test_default_resources_come_from_the_node_types_the_cluster_can_start():
  """At submit time a `ray up` cluster is its head alone, with CPU 0: the node types of its cluster file decide
  (the shipped GPU and TPU files); an autoscaler whose types are unknown, or no node that can run a member, asks
  for --member_resources instead of members on the CPUs of a GPU cluster."""
  import yaml
  head = [{"CPU": 0, "memory": 1e10}]
  for name, wanted in (("gcp_gpu", {"CPU": 1, "GPU": 1}), ("gcp_tpu", {"CPU": 1, "TPU": 4})):
    with open(os.path.join(REPO, "clusters", f"{name}.yaml")) as f:
      types = ray_backend.node_types_of_config(yaml.safe_load(f))
    assert ray_backend.default_resources(head, types, autoscaled=True).per_host == wanted
  cpu_types = ray_backend.node_types_of_config({"head_node_type": "h", "available_node_types": {
      "h": {"resources": {"CPU": 0}}, "w": {"resources": {"CPU": 16}, "max_workers": 4},
      "off": {"resources": {"GPU": 8}, "max_workers": 0}}})
  assert cpu_types == [{"CPU": 0}, {"CPU": 16}]  # a type that can never start does not count
  assert ray_backend.default_resources(head, cpu_types, autoscaled=True).per_host == {"CPU": 16}
  assert ray_backend.node_types_of_config({"available_node_types": {"w": {"node_config": {}}}}) is None
  with pytest.raises(UserError, match="autoscaler whose node types this driver cannot read.*--member_resources"):
    ray_backend.default_resources(head, None, autoscaled=True)
  assert ray_backend.default_resources(head + [{"CPU": 8, "GPU": 2}], None, autoscaled=True).per_host["GPU"] == 1
  with pytest.raises(UserError, match=r"CPU 0 everywhere.*--member_resources"):
    ray_backend.default_resources(head)
  # The autoscaler's config file: the --autoscaling-config of this cluster's monitor.py (not another cluster's,
  # nor Ray's log monitor), as `ray up` starts it on the head.
  monitor = ["python", "-u", "/v/ray/autoscaler/_private/monitor.py", "--gcs-address=10.0.0.1:6379"]
  processes = [["python", "/v/ray/_private/log_monitor.py", "--gcs-address=10.0.0.1:6379", "--autoscaling-config=/x"],
               monitor[:3] + ["--gcs-address=10.0.0.9:6379", "--autoscaling-config=/other.yaml"], monitor,
               monitor + ["--autoscaling-config=/home/u/ray_bootstrap_config.yaml"]]
  assert ray_backend.autoscaling_config_path("10.0.0.1:6379", processes) == "/home/u/ray_bootstrap_config.yaml"
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(ray_backend, "BOOTSTRAP_CONFIG", "/nonexistent/ray_bootstrap_config.yaml")
    assert ray_backend.autoscaling_config_path("10.0.0.1:6379", processes[:3]) is None


def test_a_sweep_dir_the_driver_cannot_read_is_refused(tmp_path):
  # Node 'b' wrote its probe where this driver does not see it (its own local disk).
  probe = tmp_path / ray_backend.PROBE_DIR
  probe.mkdir()
  (probe / "node-a").write_text("tok")
  with pytest.raises(UserError, match=r"nodes 10\.0\.0\.2 \(PermissionError: denied\)\); put the sweep"):
    ray_backend.verify_probes(str(tmp_path), {"10.0.0.1": "node-a", "10.0.0.2": "node-b"}, "tok",
                              {"10.0.0.2": "PermissionError: denied"})
  ray_backend.verify_probes(str(tmp_path), {"10.0.0.1": "node-a"}, "tok", {})
  assert not (probe / "node-a").exists()


def test_progress_line_counts_steps_and_time_left(tmp_path):
  m = progress.MemberProgress
  members = [m("a", "running", 10, 40, 1, 100.0), m("b", "running", 20, 40, 1, 100.0), m("c", "queued", -1, 0, 0, 0),
             m("d", "done", 40, 40, 1, 220.0), m("e", "failed", 3, 40, 2, 50.0)]
  # a: 30 steps left at 10 s/step = 300 s; b: 20 at 5 s = 100 s; c: the mean length (220, 400, 200) over 2 slots.
  assert progress.eta_s(members) == pytest.approx(max(300, (300 + 100 + (220 + 400 + 200) / 3) / 2))
  line = progress.status_line(members)
  assert line.startswith("[sweep] 1 queued, 2 running (a step 10/40, b step 20/40), 1 done, 1 failed; ~")
  assert progress.eta_s([m("c", "queued", -1, 0, 0, 0)]) is None
  # From the files of a member that is running its second attempt.
  work = tmp_path / "x"
  work.mkdir()
  (work / "attempts.jsonl").write_text('{"start": 1, "node": "n"}\n{"start": 1, "wall_s": 5, "rc": -9}\n'
                                       '{"start": 100, "node": "n"}\n')
  (work / "metrics.jsonl").write_text('{"step": 0}\n{"step": 7, "reward": 1}\n')
  (work / "config.json").write_text('{"num_steps": 9}')
  got = progress.read_member(str(tmp_path), "x", now=110.0)
  assert (got.state, got.step, got.num_steps, got.attempts, got.wall_s) == ("running", 7, 9, 2, 15.0)


def _cli(*args, env=None, **kwargs):
  return subprocess.Popen([sys.executable, os.path.join(REPO, "scripts", "sweep.py"), *args], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, **kwargs)


def _trainers(sweep_dir) -> list[str]:
  out = subprocess.run(["pgrep", "-f", f"fake_train.py.*{sweep_dir}"], capture_output=True, text=True).stdout
  return out.split()


def _wait_for(predicate, timeout_s=60.0):
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    if predicate():
      return True
    time.sleep(0.2)
  return False


@pytest.fixture
def slow_experiment(tmp_path):
  path = tmp_path / "slow.py"
  path.write_text(textwrap.dedent("""
      def get_config(preset=None):
        return {"seed": 0, "num_steps": 4, "sleep": 0.0}

      def get_sweep():
        return [{"name": f"m{i}", "overrides": {"num_steps": 4, "sleep": 1.5 if i else 0.0}} for i in range(3)]

      def get_member_resources():
        return {"CPU": 1}
      """))
  return str(path)


def test_ctrl_c_and_a_killed_driver_leave_no_trainer_and_the_same_command_resumes(tmp_path, fake_train_cmd,
                                                                                   slow_experiment):
  sweep_dir = str(tmp_path / "sweep")
  args = ["--config", slow_experiment, "--sweep_dir", sweep_dir, "--backend=ray", "--train_cmd",
          " ".join(fake_train_cmd)]
  for sig in (signal.SIGINT, signal.SIGKILL):
    driver = _cli(*args, start_new_session=True)
    try:
      assert _wait_for(lambda: len(_trainers(sweep_dir)) == 2), driver.stdout and driver.stdout.read()
      os.kill(driver.pid, sig)
      out = driver.communicate(timeout=60)[0]
    finally:
      if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
    if sig == signal.SIGINT:
      assert "interrupted: stopping every member" in out and driver.returncode != 0
    assert _wait_for(lambda: not _trainers(sweep_dir), 30), f"trainers left after {sig!r}: {_trainers(sweep_dir)}"
  assert runner.status(os.path.join(sweep_dir, "m0")) == "done"
  driver = _cli(*args)
  out = driver.communicate(timeout=120)[0]
  assert driver.returncode == 0, out
  assert "each member needs {\"CPU\": 1}" in out  # from the experiment file's get_member_resources()
  assert "0 queued, 0 running, 3 done, 0 failed" in out
  summary = out[out.index("\nmember ") + 1:].splitlines()
  assert summary[1].split()[:2] == ["m0", "skipped-done"] and summary[2].split()[:3] == ["m1", "done", "3"]
  for name in ("m1", "m2"):  # two interrupted attempts, then one to the end (exact resumes: test_real_trainer...)
    assert progress.read_member(sweep_dir, name).attempts == 3
    assert _rows(os.path.join(sweep_dir, name))[-1]["step"] == 4


def test_missing_extra_is_one_line(tmp_path, experiment_file):
  fake = tmp_path / "noray" / "ray"
  fake.mkdir(parents=True)
  (fake / "__init__.py").write_text("raise ImportError('No module named ray')\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "noray"), os.environ["PYTHONPATH"]])}
  driver = _cli("--config", experiment_file, "--sweep_dir", str(tmp_path / "s"), "--backend=ray", env=env)
  out = driver.communicate(timeout=60)[0]
  assert driver.returncode == 2
  assert out.strip() == "grpo-sweep: error: --backend=ray needs Ray, an optional extra: pip install -e '.[ray]'"
  assert not (tmp_path / "s").exists()


def test_lost_nodes_and_workers_are_preemptions_other_errors_are_not():
  from ray import exceptions as rex
  lost = [rex.NodeDiedError("node 10.0.0.2 died (preempted)"), rex.WorkerCrashedError(),
          rex.LocalRayletDiedError(), rex.OwnerDiedError("ab" * 14, None, "")]
  assert all(map(ray_backend.preempted_error, lost))
  wrapped = rex.RayTaskError("_member_task", "Traceback ...", rex.NodeDiedError("gone"))
  assert ray_backend.preempted_error(wrapped)
  not_lost = [rex.RayTaskError("_member_task", "Traceback ...", ValueError("a bug")), rex.TaskCancelledError(),
              rex.OutOfMemoryError("the trainer used too much memory"), rex.RuntimeEnvSetupError("pip failed"),
              ValueError("a bug")]
  assert not any(map(ray_backend.preempted_error, not_lost))


def test_preempted_members_are_resubmitted_apart_from_max_attempts_and_capped(tmp_path, fake_train_cmd):
  """With max_attempts=1: a member preempted once (its trainer exits 75) is resubmitted and finishes; one that
  is always preempted stops after max_preemptions resubmissions, marked FAILED; a crash is not retried. The live
  line and the summary count preemptions apart from failures."""
  members = spec.validate([{"name": "once", "overrides": {"num_steps": 4, "preempt_at": 2}},
                           {"name": "always", "overrides": {"always_preempted": True}},
                           {"name": "crash", "overrides": {"crash_at": 2}}])
  lines = []
  outcomes = ray_backend.run_members(members, config_spec="exp.py", sweep_dir=str(tmp_path), train_cmd=fake_train_cmd,
                                   resources=CPU1, init_kwargs=LOCAL, poll_s=0.2, echo=lines.append,
                                   max_attempts=1, max_preemptions=1)
  assert outcomes == {"once": "done", "always": "failed", "crash": "failed"}
  ends = {n: [(r["rc"], r["outcome"]) for r in runner.read_jsonl(RunFiles(str(tmp_path / n)).attempts) if "rc" in r]
          for n in outcomes}
  assert ends == {"once": [(75, "preempted"), (0, "done")], "always": [(75, "preempted")] * 2,
                  "crash": [(1, "failed")]}
  assert [r["step"] for r in _rows(tmp_path / "once")] == [0, 1, 2, 3, 4]
  assert "more than --max_preemptions=1" in runner.read_json(str(tmp_path / "always" / "FAILED"))["error"]
  assert any(", 2 failed, 3 preempted" in line for line in lines if line.startswith("[sweep] 0 queued"))
  summary = lines[-1].splitlines()
  assert [row.split()[:4] for row in summary[1:4]] == [["once", "done", "2", "1"], ["always", "failed", "2", "2"],
                                                       ["crash", "failed", "1", "0"]]


def test_a_lost_attempt_gets_one_end_row(tmp_path):
  """The driver ends an attempt lost with its worker: the open one (killed: no row of its own), or, after a
  worker stopped by SIGTERM ended its attempt itself, only if that row does not say preempted already."""
  from ray import exceptions as rex
  lost = rex.NodeDiedError("node 10.0.0.2 died")

  def ends(rows):
    work = tmp_path / str(len(list(tmp_path.iterdir())))
    work.mkdir()
    Path(RunFiles(str(work)).attempts).write_text("".join(json.dumps(r) + "\n" for r in rows))
    ray_backend._end_lost_attempt(str(work), "preempted", lost)
    got = progress.read_member(str(tmp_path), work.name)
    return [(r["start"], r["rc"], r["outcome"]) for r in runner.read_jsonl(RunFiles(str(work)).attempts) if "rc" in r], \
        (got.attempts, got.preempted)

  start = time.time() - 5
  (row,), counts = ends([{"start": start, "node": "n"}])
  assert row == (start, None, "preempted") and counts == (1, 1)
  assert ends([{"start": 1, "node": "n"}, {"start": 1, "wall_s": 2, "rc": 75, "outcome": "preempted"}]) == (
      [(1, 75, "preempted")], (1, 1))
  assert ends([{"start": 1, "node": "n"}, {"start": 1, "wall_s": 2, "rc": -15, "outcome": "stopped"}]) == (
      [(1, -15, "stopped"), (1, None, "preempted")], (1, 1))
  assert ends([]) == ([(None, None, "preempted")], (0, 1))  # lost before its trainer started
