"""The Ray backend with the real trainer and real clusters, in one file so that its tests run one after another
(pytest-xdist --dist loadfile) rather than as competing Ray clusters: a study of four members two at once, one
of whose Ray worker dies, is resubmitted and ends with the metrics and the report of the local backend; a
two-host member on a two-node local cluster forms one world of its two processes (a stand-in trainer,
tests/sweep/world_train.py; such a world trains in tests/distributed/test_multihost.py) (and there, without --member_resources, a CPU default or one line asking for them); a member whose node dies
is resubmitted as a preemption; every `ray job submit` command of the README and the docs runs against a
one-node cluster started with `ray start --head` (the fake trainer stands in for scripts/train.py)."""
import concurrent.futures
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from grpo_jax.sweep import progress, ray_backend, report, run_sweep, runner, spec  # noqa: E402
from grpo_jax.persist.layout import RunFiles
from tests.sweep.conftest import REPO  # noqa: E402

CONFIG = "experiments/default.py:test"
COMMON = {"log.plot": False, "log.tensorboard": False}
TIMING = {"step_time", "tokens_per_s"}  # and every timing/* key


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:  # less a preempted trainer's event row
    rows = [r for r in map(json.loads, f) if "event" not in r]
  return [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("timing/")} for r in rows]


def _trainer_pids(workdir):
  out = subprocess.run(["pgrep", "-f", f"train.py .*--workdir {workdir} "], capture_output=True, text=True)
  return [int(p) for p in out.stdout.split()]


def _parent(pid):
  with open(f"/proc/{pid}/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[1])


def _overlaps(sweep_dir, names, killed_at=None):
  """The most attempts of `names` that ran at the same time (from their attempts.jsonl start and end times; an
  attempt whose Ray worker was killed ended at `killed_at`: its end row, rc null, is the driver's, written when it
  learned of the loss)."""
  events = []
  for name in names:
    rows = runner.read_jsonl(RunFiles(os.path.join(sweep_dir, name)).attempts)
    starts = [r["start"] for r in rows if "rc" not in r]
    ends = {r["start"]: r["start"] + r["wall_s"] for r in rows if "rc" in r and r["rc"] is not None}
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


@pytest.mark.faults  # 100 s; the default suite's retry on Ray: test_a_member_whose_node_dies_is_resubmitted_...
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
  outcomes = run_sweep(CONFIG, sweep_dir, backend="ray", members=members, common=common,
                             member_resources={"CPU": 1}, ray_init_kwargs={"num_cpus": 2, "include_dashboard": False},
                             echo=lambda *_: None)
  watcher.join(timeout=1)
  assert killed and outcomes == dict.fromkeys(names, "done")
  assert _overlaps(sweep_dir, names, killed[0]) == 2  # two at once, never more
  assert progress.read_member(sweep_dir, names[0]).attempts == 2
  with open(os.path.join(victim, "train.log")) as f:  # the second attempt resumed from a GRPO checkpoint
    assert re.search(r"\[resume\] restored step [24] ", f.read())
  local_dir = str(tmp_path / "local")
  assert run_sweep(CONFIG, local_dir, members=members, common=common, echo=lambda *_: None) == outcomes
  assert _metrics(victim) == _metrics(os.path.join(local_dir, names[0]))  # CPU: exactly
  assert _report_numbers(sweep_dir) == _report_numbers(local_dir)
  assert _overlaps(local_dir, names) == 1


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _check_default_resources(address, tmp_path):
  """On a cluster of CPU nodes and no autoscaler, a member takes a whole CPU node, as on a laptop; once an
  autoscaler of the cluster (a process named like Ray's monitor.py, with this cluster's GCS address) has a node
  type whose resources are unknown and no GPU or TPU is up, sweep.py stops with one line asking for
  --member_resources (exit code 2) instead of running members on CPUs."""
  ray.init(address=address, log_to_driver=False)
  try:
    assert ray_backend.cluster_node_types(ray) == (False, None)
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    assert ray_backend.default_resources(nodes).per_host == {"CPU": 1}
  finally:
    ray.shutdown()
  config = tmp_path / "cluster.yaml"
  config.write_text("max_workers: 2\nhead_node_type: head\navailable_node_types:\n  head: {resources: {CPU: 0}}\n"
                    "  gpu: {max_workers: 2, node_config: {}}\n")
  assert ray_backend.node_types_of_config(yaml.safe_load(config.read_text())) is None  # no `resources`: unknown
  exp = tmp_path / "exp.py"
  exp.write_text("def get_config(preset=None):\n  return {}\n\ndef get_sweep():\n  return [{'name': 'm'}]\n")
  monitor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)",
                              "ray/autoscaler/_private/monitor.py", f"--gcs-address={address}",
                              f"--autoscaling-config={config}"])
  try:
    out = subprocess.run([sys.executable, "scripts/sweep.py", "--config", str(exp), "--sweep_dir", str(tmp_path / "s"),
                          "--backend=ray", f"--ray_address={address}"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
  finally:
    monitor.kill()
    monitor.wait()
  assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == (
      "grpo-sweep: error: the cluster has an autoscaler whose node types this driver cannot read, and no node with "
      f"a GPU or TPU is up yet; {ray_backend.MEMBER_RESOURCES_HINT}")


def test_a_two_host_member_runs_on_two_nodes_as_one_world(tmp_path):
  """A member of {"CPU": 1, "hosts": 2} on a two-node local cluster: one process on each node (STRICT_SPREAD),
  which form one world of 4 devices (2 each) from what the backend sets (tests/sweep/world_train.py stands in
  for the trainer: a world of processes trains as one process does in tests/distributed/test_multihost.py), process
  0 the only writer; then the CPU default or one line asking for --member_resources."""
  from ray.cluster_utils import Cluster
  two_devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
  cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
  try:
    cluster.add_node(num_cpus=1)
    members = spec.validate([{"name": "two"}])
    outcomes = ray_backend.run_members(
        members, config_spec=CONFIG, sweep_dir=str(tmp_path), common=COMMON,
        train_cmd=[sys.executable, os.path.join(REPO, "tests", "sweep", "world_train.py")],
        resources=ray_backend.MemberResources.parse({"CPU": 1, "hosts": 2}), address=cluster.address,
        init_kwargs={"runtime_env": {"env_vars": two_devices}}, echo=lambda *_: None)
    _check_default_resources(cluster.address, tmp_path)
  finally:
    cluster.shutdown()
  two = os.path.join(tmp_path, "two")
  logs = [open(os.path.join(two, name)).read() for name in ("train.log", "train.1.log")]
  assert outcomes == {"two": "done"}, logs[0][-3000:] + logs[1][-3000:]
  nodes = {r["node"] for r in runner.read_jsonl(RunFiles(os.path.join(two)).attempts) if "node" in r}
  assert len(nodes) == 1 and "[done]" in logs[0] and "[done]" not in logs[1]
  with open(os.path.join(two, "world.json")) as f:
    assert json.load(f) == {"formed": True, "processes": 2, "devices": 4, "local_devices": 2, "sum": 4.0}


RAY = os.path.join(os.path.dirname(sys.executable), "ray")
DOCS = ("README.md", "docs/clusters.md", "docs/cloud.md")
RUNTIME_ENV = re.compile(r'"\$\(python scripts/ray_runtime_env\.py([^)]*)\)"')


def doc_job_commands():
  """Every `ray job submit` command of the README and the docs: (where, command with its line breaks joined)."""
  for doc in DOCS:
    with open(os.path.join(REPO, doc)) as f:
      blocks = re.findall(r"```bash\n(.*?)```", f.read(), flags=re.S)
    for block in blocks:
      for line in re.sub(r"\\\n\s*", "", block).splitlines():
        if line.strip().startswith("ray job submit"):
          yield doc, line.strip()


def as_local_job(command, dashboard, experiment_file, sweep_dir, where):
  """The printed command run against a local cluster: its address, the study (the experiment, the sweep
  directory) swapped for the tiny one of the fake trainer, and `pip` for the CPU set this machine runs (Python
  3.11; the GPU and TPU sets are Python 3.12's). Returns (argv, the runtime environment as printed)."""
  match = RUNTIME_ENV.search(command)
  assert match and " --working-dir . " in command, f"{where}: {command}"
  run = lambda *args: subprocess.run([sys.executable, "scripts/ray_runtime_env.py", *args], cwd=REPO,  # noqa: E731
                                     check=True, capture_output=True, text=True).stdout
  printed = json.loads(run(*shlex.split(match.group(1))))
  env = {**printed, "pip": json.loads(run())["pip"]}
  argv = shlex.split(RUNTIME_ENV.sub("RUNTIME_ENV", command))
  argv[argv.index("RUNTIME_ENV")] = json.dumps(env)
  argv[0] = RAY
  for flag, value in (("--address", f"http://127.0.0.1:{dashboard}"), ("--config", experiment_file),
                      ("--sweep_dir", sweep_dir)):
    assert flag in argv, f"{where}: no {flag} in {command}"
    argv[argv.index(flag) + 1] = value
  if "--submission-id" in argv:  # ids are unique per cluster
    argv[argv.index("--submission-id") + 1] += f"-{os.path.basename(sweep_dir)}"
  assert argv[argv.index("--") + 1:argv.index("--") + 3] == ["python", "scripts/sweep.py"], f"{where}: {command}"
  return argv + ["--train_cmd", "python tests/sweep/fake_train.py", "--only", "^grpo_seed0$"], printed


@pytest.fixture
def head_cluster():
  """A one-node cluster started with `ray start --head`, with one (logical) GPU and 4 TPU chips so that the
  docs' --member_resources can be placed; yields (environment, GCS port, dashboard port)."""
  # `python` on the node is the one with the packages (the `ray up` files activate their virtualenv likewise).
  env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
         "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
  env.pop("RAY_ADDRESS", None)
  # Ports of our own: the defaults (8265, the job agent's 52365, 10001) may still be held by a Ray instance that
  # another test just stopped, and a job agent that cannot bind its port never comes up.
  gcs, dashboard, agent, client = (_free_port() for _ in range(4))
  subprocess.run([RAY, "start", "--head", "--num-cpus=2", "--num-gpus=1", '--resources={"TPU": 4}', f"--port={gcs}",
                  "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
                  f"--dashboard-agent-listen-port={agent}", f"--ray-client-server-port={client}"],
                 env=env, check=True, capture_output=True, timeout=120)
  try:
    yield env, gcs, dashboard
  finally:
    _stop_cluster(gcs)


def _stop_cluster(gcs_port):
  """Kills the processes of the `ray start` cluster whose GCS listens on `gcs_port`: those that name the port,
  and their children (the dashboard's modules, the agents, the workers). Not `ray stop --force`, which kills
  every Ray process of the machine: another pytest worker's test lost its local instance to it."""
  import psutil
  named = [p for p in psutil.process_iter(["cmdline"])
           if re.search(rf"[:=]{gcs_port}\b", " ".join(p.info["cmdline"] or []))]
  procs = set(named)
  for p in named:
    with contextlib.suppress(psutil.NoSuchProcess):
      procs.update(p.children(recursive=True))
  for p in procs:
    with contextlib.suppress(psutil.NoSuchProcess):
      p.kill()
  psutil.wait_procs(procs, timeout=30)


def _submit(argv, env):
  submit = lambda: subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)  # noqa: E731
  job = submit()
  for _ in range(30):  # `ray start` returns before the dashboard's job agent is up (more so on a busy machine)
    if "No available agent to submit job" not in job.stderr + job.stdout:
      break
    time.sleep(2)
    job = submit()
  if "Failed to connect to Ray cluster" in job.stdout + job.stderr:  # a GCS starved by a loaded machine, once
    job = submit()
  return job


def test_every_ray_job_submit_of_the_docs_runs_as_printed(tmp_path, experiment_file, head_cluster):
  """Each `ray job submit` of README.md, docs/clusters.md and docs/cloud.md against a `ray start --head` cluster,
  as printed but for as_local_job's changes (commands that differ only in their runtime environment run once):
  Ray installs the CPU set, and the member runs from the copy of the repository the job uploaded. What the
  printed runtime environments would install: exact versions, the set of the nodes they name."""
  env, _, dashboard = head_cluster
  commands = list(doc_job_commands())
  assert {doc for doc, _ in commands} == set(DOCS)
  jobs = {}
  for i, (where, command) in enumerate(commands):
    argv, printed = as_local_job(command, dashboard, experiment_file, str(tmp_path / f"s{i}"), where)
    assert {"runs", ".venv", "checkpoints", "models"} <= set(printed["excludes"]), where
    packages = printed.get("pip", {}).get("packages", [])
    assert all("==" in p for p in packages), where
    if "cuda12" in command:
      assert "jax-cuda12-plugin==0.11.2" in packages and "jax==0.11.2" in packages, where
    key = tuple(a for i, a in enumerate(argv) if not a.startswith(str(tmp_path)) and "{" not in a
                and argv[i - 1] != "--submission-id")
    jobs.setdefault(key, (where, argv))
  assert len(jobs) == 2  # one command per kind of node: GPUs and TPUs
  with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # at once: each mostly waits for Ray
    done = list(pool.map(lambda run: _submit(run[1], env), jobs.values()))
  for (where, argv), job in zip(jobs.values(), done):
    assert job.returncode == 0, f"{where}: {shlex.join(argv)}\n" + job.stdout[-3000:] + job.stderr[-3000:]
    assert "[sweep] 1 members: 1 done" in job.stdout, where
    with open(os.path.join(argv[argv.index("--sweep_dir") + 1], "grpo_seed0", "invocations_env.jsonl")) as f:
      (row,) = [json.loads(line) for line in f]
    # The trainer ran from the copy of the repository the job uploaded, not from this checkout.
    assert "working_dir_files" in row["file"] and not row["file"].startswith(REPO + os.sep), row["file"]


def test_a_member_whose_node_dies_is_resubmitted_as_a_preemption(tmp_path, fake_train_cmd):
  """A local cluster (`ray.cluster_utils.Cluster`) of a head without CPUs and two one-CPU nodes; the node whose
  member trains is killed: the driver counts a preemption (not one of the --max_attempts=1), writes the lost
  attempt's end row and resubmits the member, which finishes on the other node."""
  from ray.cluster_utils import Cluster
  cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
  try:
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    (member,) = spec.validate([{"name": "m", "overrides": {"num_steps": 6, "sleep": 0.5}}])
    workdir = tmp_path / "m"
    killed = []

    def kill_the_node_of_the_member_after_step_2():
      deadline = time.time() + 300
      while time.time() < deadline and not killed:
        pids = _trainer_pids(str(workdir))
        metrics = workdir / "metrics.jsonl"
        if pids and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
          raylet = _parent(_parent(pids[0]))  # trainer <- Ray worker <- the node's raylet
          (node,) = [n for n in nodes if n.all_processes["raylet"][0].process.pid == raylet]
          cluster.remove_node(node, allow_graceful=False)
          killed.append(time.time())
        time.sleep(0.1)

    watcher = threading.Thread(target=kill_the_node_of_the_member_after_step_2, daemon=True)
    watcher.start()
    outcomes = ray_backend.run_members([member], config_spec="exp.py", sweep_dir=str(tmp_path), train_cmd=fake_train_cmd,
                                     resources=ray_backend.MemberResources.parse({"CPU": 1}), address=cluster.address,
                                     max_attempts=1, poll_s=0.2, echo=lambda *_: None)
    watcher.join(timeout=1)
  finally:
    cluster.shutdown()
  assert killed and outcomes == {"m": "done"}
  ends = [r for r in runner.read_jsonl(RunFiles(str(workdir)).attempts) if "rc" in r]
  # A worker that outlives its raylet for a moment may first end the attempt itself: a row of its own, "stopped"
  # (it stopped its trainer) or "failed" with a negative exit code (the trainer was killed by a signal with the
  # node). Either way the driver's rows follow: the lost attempt preempted, then the resubmitted one done.
  own = [(r["rc"], r["outcome"]) for r in ends
         if r["outcome"] != "stopped" and not (r["outcome"] == "failed" and (r["rc"] or 0) < 0)]
  assert own == [(None, "preempted"), (0, "done")], ends
  lost = next(r for r in ends if r["outcome"] == "preempted")  # the driver's row, after the worker's own if any
  assert lost["error"].startswith("NodeDiedError: "), ends
  assert progress.read_member(str(tmp_path), "m").preempted == 1
