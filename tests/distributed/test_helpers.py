"""grpo_jax.train.distributed and offload in one process: when jax.distributed starts, and the one-process
identities of the multi-host helpers (the multi-process behaviour is test_multihost.py's)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from grpo_jax import config as config_lib
from grpo_jax.model import sharding
from grpo_jax.settings import Settings
from grpo_jax.train import distributed, offload
from grpo_jax.train import checks

_CLUSTER_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_NTASKS",
                 "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


@pytest.fixture
def no_cluster(monkeypatch):
  for v in _CLUSTER_VARS:
    monkeypatch.delenv(v, raising=False)
  started = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: started.append(kw))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  return started


def _initialize(config) -> bool:
  """What grpo_jax.train.loop does: the config's `distributed` section, checked, to distributed.initialize."""
  return distributed.initialize(Settings.from_config(config).distributed)


def test_initialize_only_when_asked(no_cluster, monkeypatch):
  c = config_lib.get_config()
  assert _initialize(c) is False and no_cluster == []      # auto, nothing in the environment
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert _initialize(c) is False                           # a one-task SLURM job: one process
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert _initialize(c) is True and no_cluster[-1] == {}   # JAX's SLURM detection does the rest
  c.distributed.enabled = "no"
  assert _initialize(c) is False and len(no_cluster) == 1


def test_initialize_passes_config_then_environment(no_cluster, monkeypatch):
  c = config_lib.get_config()
  c.distributed.coordinator_address = "node0:1234"
  c.distributed.num_processes = 4
  c.distributed.local_device_ids = "0,1"
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  assert _initialize(c)
  assert no_cluster[-1] == dict(coordinator_address="node0:1234", num_processes=4, process_id=3,
                                local_device_ids=[0, 1])
  monkeypatch.setenv("JAX_PROCESS_ID", "three")
  with pytest.raises(ValueError, match="JAX_PROCESS_ID='three' is not an integer"):
    _initialize(c)
  c.distributed.enabled = "maybe"
  with pytest.raises(ValueError, match="config.distributed.enabled"):
    checks.validate(c)


def test_one_process_identities():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  assert distributed.local_rows(mesh, 12) == (0, 12)
  assert distributed.local_prompt_slice(mesh, 3, 4) == (0, 3)
  m = {"reward": 0.5, "completions/min_length": 2.0}
  assert distributed.merge_metrics(m) == m
  np.testing.assert_array_equal(distributed.allgather(np.arange(3)), [[0, 1, 2]])
  x = distributed.put_batch((np.arange(6).reshape(3, 2), None), mesh)
  assert x[1] is None and x[0].sharding.spec == distributed.BATCH_SPEC
  np.testing.assert_array_equal(np.asarray(x[0]), np.arange(6).reshape(3, 2))

  class Echo:
    def generate(self, state, prompts, key, repeats=1):
      return [p for p in prompts for _ in range(repeats)]
  assert distributed.GlobalSampler(Echo(), 0).generate(None, [[1, 2]], None) == [[1, 2]]
  assert distributed.GlobalSampler(Echo(), 0).generate(None, [[1], [2]], None, repeats=2) == [[1], [1], [2], [2]]


def test_offloader_parks_in_host_memory_and_fetches_back():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  tree = {"w": jax.device_put(np.ones((2, 3), np.float32), jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))}
  off = offload.RefOffloader(True, mesh)
  assert off.active == offload.host_memory_supported(mesh)
  parked = off.park(tree)
  if off.active:  # CPU has pinned_host memory in this jax build
    assert parked["w"].sharding.memory_kind == offload.HOST_MEMORY
  back = off.fetch(parked)
  assert back["w"].sharding.memory_kind == jax.devices()[0].default_memory().kind
  np.testing.assert_array_equal(np.asarray(back["w"]), 1.0)
  off_disabled = offload.RefOffloader(False, mesh)
  assert off_disabled.park(tree) is tree and off_disabled.fetch(None) is None


def test_merge_gives_every_process_the_same_names_for_counts_only_some_report(monkeypatch):
  """Two processes (the gather simulated): process 0 had a reward failure and a hung environment call, process
  1 neither. Both must gather the same names in the same order; counts (failures, env_failures, hung calls) are
  summed, the rest averaged."""
  p0 = {"reward": 0.5, "rewards/r/mean": 0.5, "rewards/r/failures": 3, "episodes/turns": 2.0,
        "episodes/env_failures": 2, "episodes/hung_calls": 1}
  p1 = {"reward": 0.25, "rewards/r/mean": 0.25, "episodes/turns": 1.0, "episodes/env_failures": 1}
  gathered = []

  def fake_allgather(x):
    gathered.append(x)
    if len(gathered) == 1:  # this process is process 1: return what both sent
      return np.stack([other, x])
    raise AssertionError("one gather per merge")

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(distributed, "allgather", fake_allgather)
  names = sorted(set(p0) | set(p1))
  other = np.array([float(p0[k]) for k in names])  # what process 0 sends (it has every name)
  out = distributed.merge_metrics(p1)
  assert len(gathered[0]) == len(names)
  assert out == {"reward": 0.375, "rewards/r/mean": 0.375, "rewards/r/failures": 3, "episodes/turns": 1.5,
                 "episodes/env_failures": 3, "episodes/hung_calls": 1}
