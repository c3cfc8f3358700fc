"""Multi-host runs on JAX's multi-controller runtime: one Python process per host, all running the same program.

`initialize(config)` starts `jax.distributed` (from `config.distributed` or the environment: SLURM, TPU pod
slices and `JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID` are detected by JAX itself).
Afterwards `jax.devices()` lists the devices of every process, the mesh spans them all, and every jitted
program (sampler, reference log-probs, update) runs as one global SPMD program.

Data: each process owns the rows of the global rollout batch that its devices hold under the batch sharding
('batch' -> ('data', 'fsdp')). `local_rows` finds them, the loop loads only those prompts (a deterministic
position per process: the step's global data position + the process's first row), and `put_batch` assembles
the global arrays from the per-process pieces (`jax.make_array_from_process_local_data`).

Sampling: `GlobalSampler` gathers every process's prompts, runs the (jitted, mesh-wide) sampler on the whole
batch, identical on every process, and hands each process its own rows. The sampled tokens are then those of a
single-process run of the same global batch: JAX's partitionable threefry draws the same random bits for a row
whatever the sharding. Rewards and advantages are computed per process on its own rows (groups never straddle
processes); `merge_metrics` combines the rollout metrics of all processes for logging.

Only process 0 writes logs, metrics, samples and plots (`is_main`); checkpoints are written collectively by
orbax (every process calls save/restore).
"""
from __future__ import annotations

import json
import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec


logger = logging.getLogger(__name__)

BATCH_SPEC = PartitionSpec(("data", "fsdp"))
# Any of these makes enabled="auto" start jax.distributed (a SLURM job with more than one task, see initialize).
_ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


def initialize(d) -> bool:
  """Starts jax.distributed when the run's `distributed` section `d` (grpo_jax/settings.py: DistributedSettings)
  or the environment asks for it; True if it is (now) running.

  d.enabled: "auto" (default: initialize when `coordinator_address` is set, or the environment
  has JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES, a SLURM job of more than one task, or a GKE TPU slice),
  "yes" (always: JAX detects the cluster; use it on Cloud TPU VM pod slices), "no". `coordinator_address`,
  `num_processes` (0: JAX_NUM_PROCESSES or the cluster's), `process_id` (-1: JAX_PROCESS_ID or the cluster's)
  and `local_device_ids` ("": JAX's default; under SLURM that is the one GPU numbered SLURM_LOCALID) are passed
  through when set. Must run before any other JAX call touches the devices.
  """
  enabled = d.enabled
  if enabled == "no":
    return False
  address = d.coordinator_address
  slurm_tasks = _env_int("SLURM_NTASKS") or 1
  if enabled == "auto" and not address and slurm_tasks <= 1 and not any(v in os.environ for v in _ENV_VARS):
    return False
  if jax.distributed.is_initialized():
    return True
  # Config first, then JAX_NUM_PROCESSES / JAX_PROCESS_ID (read here: JAX itself reads only the coordinator's
  # address from the environment), else JAX's cluster detection (SLURM, TPU, ...). None: not passed.
  kwargs = {"coordinator_address": address or None,
            "num_processes": d.num_processes if d.num_processes > 0 else _env_int("JAX_NUM_PROCESSES"),
            "process_id": d.process_id if d.process_id >= 0 else _env_int("JAX_PROCESS_ID"),
            "local_device_ids": [int(i) for i in str(d.local_device_ids).split(",")] if d.local_device_ids else None}
  jax.distributed.initialize(**{k: v for k, v in kwargs.items() if v is not None})
  logger.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
              jax.process_count(), jax.local_device_count(), jax.device_count())
  return True


def _env_int(name: str) -> int | None:
  value = os.environ.get(name, "")
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def is_main() -> bool:
  """True on the process that writes logs, metrics, samples and plots."""
  return jax.process_index() == 0


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, BATCH_SPEC)


def local_rows(mesh, num_rows: int) -> tuple[int, int]:
  """[start, stop): the rows of a global batch of `num_rows` that this process's devices hold.

  Raises ValueError when the batch does not divide over ('data', 'fsdp') or this process's rows are not one
  contiguous block (a mesh whose 'data'/'fsdp' axes interleave the processes' devices).
  """
  ways = mesh.shape["data"] * mesh.shape["fsdp"]
  if num_rows % ways:
    raise ValueError(f"a batch of {num_rows} rows does not divide over the mesh's data * fsdp = {ways} devices")
  index_map = batch_sharding(mesh).addressable_devices_indices_map((num_rows,))
  blocks = sorted({(s[0].start or 0, num_rows if s[0].stop is None else s[0].stop) for s in index_map.values()})
  start, stop = blocks[0][0], blocks[-1][1]
  if sum(b - a for a, b in blocks) != stop - start:
    raise ValueError(f"process {jax.process_index()} holds rows {blocks} of the batch: not one contiguous block; "
                     "order the mesh so that each process's devices are adjacent along ('data', 'fsdp')")
  return start, stop


def local_prompt_slice(mesh, prompts_per_step: int, group_size: int) -> tuple[int, int]:
  """(offset, count): the prompts of one step this process loads (its rows are offset*G .. (offset+count)*G)."""
  start, stop = local_rows(mesh, prompts_per_step * group_size)
  if start % group_size or stop % group_size:
    raise ValueError(f"process {jax.process_index()} holds rollout rows [{start}, {stop}), which split a group of "
                     f"group_size={group_size}; make prompts_per_step * group_size / (mesh data * fsdp) a "
                     "multiple of group_size")
  return start // group_size, (stop - start) // group_size


def put_batch(tree, mesh):
  """Global arrays, split along ('data', 'fsdp'), from each process's rows (numpy; None passes through)."""
  sharding = batch_sharding(mesh)
  # None leaves (e.g. ref_logp_BxC before the reference pass) are empty subtrees: kept as they are.
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), tree)


def local_batch(tree, mesh):
  """The inverse of `put_batch`: this process's rows of global arrays, as numpy (the tree itself with one
  process)."""
  if jax.process_count() == 1:
    return tree
  return jax.tree.map(lambda x: np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, BATCH_SPEC)),
                      tree)


def allgather(x: np.ndarray) -> np.ndarray:
  """[num_processes, *x.shape]: x from every process, in process order (identity with one process)."""
  if jax.process_count() == 1:
    return np.asarray(x)[None]
  return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def allgather_json(value) -> list:
  """[value of process 0, value of process 1, ...] for a JSON-serialisable value (a collective)."""
  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  sizes = allgather(np.array([data.size], np.int64))[:, 0]
  rows = allgather(np.pad(data, (0, int(sizes.max()) - data.size)))
  return [json.loads(row[:size].tobytes()) for row, size in zip(rows, sizes)]


def all_true(flag: bool) -> bool:
  """True when `flag` is true on every process (a collective; the flag itself with one process)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(allgather(np.array([bool(flag)])).all())


class GlobalSampler:
  """Runs a `Sampler` on the prompts of all processes together; each process gets back its own rows.

  `prompts` given to `generate(state, prompts, key, repeats)` are this process's prompts, whose rows are
  [row_start, row_start + len(prompts) * repeats) of the global batch (whole groups: row_start is a multiple of
  repeats). With one process it is the wrapped sampler.
  """

  def __init__(self, sampler, row_start: int = 0):
    self.sampler, self.row_start = sampler, row_start

  def generate(self, state, prompts: list[list[int]], key, repeats: int = 1, **keyed):
    """`keyed` (row_keys, prefixes, budget: `Sampler.generate`'s keyed rows) with one process only."""
    if jax.process_count() == 1:
      return self.sampler.generate(state, prompts, key, repeats=repeats, **keyed)
    if keyed:
      raise ValueError("GlobalSampler: keyed rows (row_keys, prefixes, budget) work in one process")
    if self.row_start % repeats:
      raise ValueError(f"GlobalSampler: row_start={self.row_start} splits a group of {repeats} rows")
    row_start = self.row_start // repeats  # in prompts
    width = int(allgather(np.array([max(len(p) for p in prompts)])).max())
    ids = np.full((len(prompts), width), -1, np.int64)
    for i, p in enumerate(prompts):
      ids[i, :len(p)] = p
    all_ids = allgather(ids)                                   # [num_processes, b, width]
    starts = allgather(np.array([row_start]))[:, 0]
    total = int(max(s + all_ids.shape[1] for s in starts))
    rows: list[list[int] | None] = [None] * total
    for s, block in zip(starts, all_ids):
      for i, r in enumerate(block):
        rows[s + i] = [int(t) for t in r if t >= 0]
    if any(r is None for r in rows):
      raise ValueError(f"the processes' prompt rows (starts {starts.tolist()}) leave gaps in the global batch")
    out = self.sampler.generate(state, rows, key, repeats=repeats)
    mine = slice(row_start * repeats, (row_start + len(prompts)) * repeats)
    return type(out)(*[None if x is None else x[mine] for x in out])


def merge_metrics(metrics: dict[str, float]) -> dict[str, float]:
  """Rollout metrics of all processes combined (equal rows per process): mean, or min/max/sum by name."""
  metrics = dict(metrics)
  if jax.process_count() == 1:
    return metrics
  # A failure count exists only where a reward function failed, a hung-call count only where an environment
  # call hangs: give every process the same names.
  for k in list(metrics):
    if k.startswith("rewards/") and k.endswith("/mean"):
      metrics.setdefault(k[:-len("/mean")] + "/failures", 0)
    if k.endswith("episodes/turns"):
      metrics.setdefault(k[:-len("turns")] + "hung_calls", 0)
  names = sorted(metrics)
  values = allgather(np.array([float(metrics[k]) for k in names], np.float64))  # [num_processes, K]
  if values.shape[1] != len(names):
    raise ValueError("processes report different rollout metrics")
  out = {}
  for j, k in enumerate(names):
    col = values[:, j]
    if k.endswith("min_length"):
      out[k] = float(col.min())
    elif k.endswith("max_length"):
      out[k] = float(col.max())
    elif k.endswith("/failures") or k.endswith("/hung_calls"):
      if col.sum() > 0:
        out[k] = int(col.sum())
    elif k.endswith("/env_failures"):  # a count of episodes, always reported
      out[k] = int(col.sum())
    else:
      out[k] = float(col.mean())
  return out
