"""The lease that holds a workdir on a store: one holder, renewed while it lives, taken over when stale or
when its holder's process on this host is gone; a second launch refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from grpo_jax import errors
from grpo_jax.persist import lease as lease_lib
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.workdir_lock import WorkdirLock


def test_a_second_launch_is_refused_in_one_line_and_the_lease_is_released_at_the_end(store):
  workdir = store.url()
  with WorkdirLock(workdir, ttl_s=30):
    with pytest.raises(errors.WorkdirError) as refused:
      with WorkdirLock(workdir, ttl_s=30):
        pass
    message = str(refused.value)
    assert "\n" not in message and f"workdir {workdir} is in use by process {os.getpid()}" in message
    assert "--workdir" in message
  assert lease_lib.store_for(RunFiles(workdir).lease).read() is None  # released
  with WorkdirLock(workdir, ttl_s=30):  # and free again
    pass


def test_a_stale_lease_is_taken_over_and_its_old_holder_learns_it_lost(store):
  url = RunFiles(store.url()).lease
  now = [1000.0]
  lost = threading.Event()
  old = lease_lib.Lease(url, ttl_s=10, clock=lambda: now[0], on_lost=lost.set)
  old.pid = 1  # a live process (init) on this host: only staleness frees the lease
  old.acquire()
  now[0] += 9
  with pytest.raises(errors.WorkdirError):  # renewed 9 s ago: still held
    lease_lib.Lease(url, ttl_s=10, clock=lambda: now[0]).acquire()
  now[0] += 2
  new = lease_lib.Lease(url, ttl_s=10, clock=lambda: now[0])
  assert new.acquire().startswith("stale: not renewed for 11s")
  assert not old.renew() and old.lost  # the old holder's next renewal finds the lease replaced
  assert new.renew()


def test_renewal_keeps_a_short_lease_held(store):
  url = RunFiles(store.url()).lease
  with lease_lib.Lease(url, ttl_s=0.6):
    time.sleep(1.5)  # more than two ttls: only the renewals every 0.2 s keep it fresh
    with pytest.raises(errors.WorkdirError):
      lease_lib.Lease(url, ttl_s=0.6).acquire()


def test_a_killed_runs_command_started_again_takes_its_lease_back_at_once(store):
  url = RunFiles(store.url()).lease
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  killed = lease_lib.Lease(url, ttl_s=3600)
  killed.pid = int(dead.stdout)  # the lease a SIGKILLed run left, renewed a moment ago, ttl an hour
  killed.acquire()
  holder = json.loads(lease_lib.store_for(url).read()[0])
  assert holder["pid"] == killed.pid and time.time() - holder["renewed_at"] < 60
  t0 = time.time()
  reason = lease_lib.Lease(url, ttl_s=3600).acquire()
  assert time.time() - t0 < 5
  assert reason == f"its holder, process {killed.pid} on this host, is gone"


def test_of_racing_launches_exactly_one_takes_the_lease(store):
  url = RunFiles(store.url()).lease
  outcomes = []
  barrier = threading.Barrier(4)

  def launch():
    barrier.wait()
    try:
      lease_lib.Lease(url, ttl_s=60).acquire()
      outcomes.append("held")
    except errors.WorkdirError:
      outcomes.append("refused")

  threads = [threading.Thread(target=launch) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert sorted(outcomes) == ["held", "refused", "refused", "refused"]


def test_the_launcher_refuses_a_second_run_on_a_store_workdir_in_one_line(store, tmp_path):
  from tests.test_launcher_errors import _one_line, _train
  workdir = store.url()
  with lease_lib.Lease(RunFiles(workdir).lease, ttl_s=60):  # a live run holds it
    proc = _train(workdir, env=dict(os.environ, **store.env))
  _one_line(proc, f"workdir {workdir} is in use by process {os.getpid()}", "use another --workdir")
