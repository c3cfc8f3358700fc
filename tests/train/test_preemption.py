"""grpo_jax/persist/preemption.py: signals, the deadline, the clouds' early warnings; the reward worker's calm.

A whole run stopped by SIGTERM / SIGINT at each point and resumed: tests/train/test_faults.py; two processes,
one signalled: tests/distributed/test_multihost.py."""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from grpo_jax import errors
from grpo_jax.config import get_config
from grpo_jax.train.checks import validate
from grpo_jax.rewards import isolation
from grpo_jax.persist import preemption as preemption_lib
from grpo_jax.persist.preemption import Preemption
from tests.train.conftest import ROOT


def test_outside_deferred_a_signal_raises_at_once_inside_it_waits_for_the_safe_point():
  lines = []
  with Preemption(60, lines.append) as p:
    with pytest.raises(errors.Preempted):
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(5)  # the handler raises in the main thread long before this ends
    assert p.reason == "SIGTERM" and lines[0].startswith("[preempted] SIGTERM")
  with Preemption(60, lines.append) as p:
    with p.deferred():
      assert not p.stop_requested()
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.01)
      assert p.stop_requested() and p.reason == "SIGTERM"


def test_a_second_ctrl_c_interrupts_at_once():
  with Preemption(60, lambda line: None) as p:
    with p.deferred():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.01)
      assert p.reason == "SIGINT"
      with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)


def test_previous_handlers_come_back():
  before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  with Preemption(60, lambda line: None) as p:
    p.install()  # twice (as after jax.distributed.initialize): the handlers kept are the ones from before
    assert signal.getsignal(signal.SIGTERM) == p._on_signal
  assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


_STUCK = """
import time
from grpo_jax.persist.preemption import Preemption
with Preemption({deadline}, lambda line: print(line, flush=True)) as p:
  with p.deferred():
    print("ready", flush=True)
    time.sleep(60)  # a step far longer than the deadline: never reaches a safe point
"""


def test_the_watchdog_ends_a_run_stuck_past_the_deadline_with_the_preempted_code():
  proc = subprocess.Popen([sys.executable, "-c", _STUCK.format(deadline=1.5)], cwd=ROOT, stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == "ready"
  t0 = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=30)
  assert proc.returncode == errors.EXIT_PREEMPTED
  assert 1.5 <= time.monotonic() - t0 < 10
  assert "still running 2 s after SIGTERM" in out


_COMPILING = """
import os, signal, sys, threading
import jax, jax.numpy as jnp
from grpo_jax import errors
from grpo_jax.persist.preemption import Preemption, exit_preempted

def deep(x):  # 300 matmuls unrolled: a second or more of XLA's compile
  for i in range(300):
    x = jnp.sin(x) @ x + i
  return x

lowered = jax.jit(deep).lower(jnp.ones((8, 8)))
try:
  with Preemption(60, lambda line: None):
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    lowered.compile()
    print("compiled before the signal", flush=True)
except errors.Preempted:  # as grpo-train's launcher does
  print("preempted while compiling", flush=True)
  exit_preempted(tell_coordinator=True)
"""


def test_a_signal_during_an_xla_compile_exits_75_not_with_a_segfault():
  # The handler raises in the main thread while XLA's thread pool goes on compiling; sys.exit's teardown then
  # destroyed the client under that compile: exit code 139 every time on a 2-core EPYC.
  done = subprocess.run([sys.executable, "-c", _COMPILING], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.stdout.strip() == "preempted while compiling", done.stdout + done.stderr[-2000:]
  assert done.returncode == errors.EXIT_PREEMPTED, done.stderr[-2000:]


class _Metadata(http.server.BaseHTTPRequestHandler):
  """A metadata server that gives the notice from the `after`-th request on (GCE's and EC2's paths)."""
  requests = 0
  after = 2

  def _reply(self, code: int, body: str = "") -> None:
    self.send_response(code)
    self.end_headers()
    self.wfile.write(body.encode())

  def do_PUT(self):  # EC2's IMDSv2 token
    self._reply(200 if self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") else 400, "token-1")

  def do_GET(self):
    type(self).requests += 1
    noticed = type(self).requests >= type(self).after
    if self.path == "/computeMetadata/v1/instance/preempted":
      ok = self.headers.get("Metadata-Flavor") == "Google"
      self._reply(200 if ok else 403, "TRUE" if noticed else "FALSE")
    elif self.path == "/latest/meta-data/spot/instance-action":
      if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
        self._reply(401)
      elif noticed:
        self._reply(200, json.dumps({"action": "terminate", "time": "2026-11-26T17:00:00Z"}))
      else:
        self._reply(404)
    else:
      self._reply(404)

  def log_message(self, *args):
    pass


@pytest.fixture
def metadata_server():
  _Metadata.requests = 0
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"127.0.0.1:{server.server_address[1]}"
  server.shutdown()


@pytest.mark.parametrize("cloud", ["gce", "aws"])
def test_a_cloud_notice_takes_the_signal_path(cloud, metadata_server, monkeypatch):
  monkeypatch.setenv("GCE_METADATA_HOST", metadata_server)
  monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://{metadata_server}")
  monkeypatch.setattr(preemption_lib, "NOTICE_POLL_S", 0.05)
  poll = {"gce": preemption_lib.gce_preempted, "aws": preemption_lib.aws_instance_action}[cloud]
  assert poll() is None  # the first request: no notice yet
  with Preemption(60, lambda line: None, notice=cloud) as p:
    with p.deferred():
      for _ in range(200):
        if p.stop_requested():
          break
        time.sleep(0.02)
      assert p.reason == {"gce": "gce notice (preempted=TRUE)",
                          "aws": "aws notice (terminate at 2026-11-26T17:00:00Z)"}[cloud]


def test_preemption_settings_are_checked():
  c = get_config()
  c.checkpoint.preemption_deadline_s = 0.0
  with pytest.raises(errors.ConfigError, match="checkpoint.preemption_deadline_s"):
    validate(c)
  c = get_config()
  c.checkpoint.preemption_notice = "azure"
  with pytest.raises(errors.ConfigError, match="checkpoint.preemption_notice"):
    validate(c)


def test_the_reward_worker_finishes_its_call_through_sigterm_and_sigint():
  """A signal to the trainer's whole process group (a VM's shutdown, Ctrl-C in a terminal) must not kill a
  reward call in flight and have it scored as a failure: the worker ignores both, in a session of its own."""
  worker = isolation.RewardWorker()
  try:
    ref = isolation.reference(time.sleep)
    worker.call(ref, (0.0,), {}, timeout_s=60)  # started and loaded
    pid = worker.pid
    assert os.getpgid(pid) != os.getpgid(0)
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=worker.call(ref, (1.0,), {}, timeout_s=60)))
    thread.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGINT)
    thread.join(30)
    assert result == {"value": None} and worker.pid == pid and worker.started == 1
  finally:
    worker.kill()


def test_the_preempted_row_leaves_curves_and_reports_as_they_were(tmp_path):
  from grpo_jax.sweep import results
  from grpo_jax.persist.metrics import MetricsWriter
  from grpo_jax.train.plotting import plot_runs
  writer = MetricsWriter(str(tmp_path), tensorboard=False)
  for step in range(4):
    writer.write(step, {"reward": 0.1 * step, "eval/accuracy": 0.5, "kl": 0.0, "loss": 1.0})
  writer.write_event(3, {"event": "preempted", "signal": "SIGTERM", "seconds_to_save": 0.2})
  writer.close()
  rows = results.read_metrics(str(tmp_path / "metrics.jsonl"))
  steps, rewards = results.series(rows, "reward")
  assert steps.tolist() == [0, 1, 2, 3] and rewards.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
  assert rows[3]["event"] == "preempted"
  assert os.path.getsize(plot_runs([str(tmp_path)], str(tmp_path / "curves.png"))) > 1000
  resumed = MetricsWriter(str(tmp_path), tensorboard=False, resume_step=3)  # a resume keeps the row
  resumed.close()
  assert sum("preempted" in line for line in open(tmp_path / "metrics.jsonl")) == 1
