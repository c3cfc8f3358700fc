"""How code reaches a cluster: `ray job submit --working-dir . --runtime-env-json "$(python
scripts/ray_runtime_env.py)" -- python scripts/sweep.py ... --backend=ray`, against a one-node cluster started
here with `ray start --head` (the fake trainer stands in for scripts/train.py)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

from tests.sweep.conftest import REPO  # noqa: E402

RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


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
  finally:
    subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)
  assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
  assert "[sweep] 2 members: 2 done" in job.stdout
  for name in ("grpo_seed0", "rloo_seed0"):
    with open(sweep_dir / name / "invocations_env.jsonl") as f:
      (row,) = [json.loads(line) for line in f]
    # The trainer ran from the copy of the repository the job uploaded, not from this checkout.
    assert "working_dir_files" in row["file"] and not row["file"].startswith(REPO + os.sep), row["file"]
