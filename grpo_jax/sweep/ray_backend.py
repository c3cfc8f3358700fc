"""Runs a sweep's members as Ray tasks, as many at once as the cluster's resources allow.

Each member is one Ray task per attempt holding the member's resources (`MemberResources`: e.g. {"GPU": 1} per
host). The task runs the same attempt as the local backend (runner.prepare / attempt / record: the trainer as a
subprocess, the same files in SWEEP_DIR/<name>), so reports, plots and resumes do not care where it ran. Ray
does the rest:
- scheduling: a task starts when a node has its resources free; the trainer sees only the accelerators Ray
  assigned to the task (CUDA_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS, set from Ray's assignment);
- multi-host members (hosts > 1): a placement group of `hosts` bundles, one per node (STRICT_SPREAD). The task
  on bundle 0 runs process 0 and starts processes 1..N-1 as tasks on the other bundles; all get
  JAX_COORDINATOR_ADDRESS (process 0's node), JAX_NUM_PROCESSES and JAX_PROCESS_ID, which
  grpo_jax/train/distributed.py passes to `jax.distributed.initialize`. If one process fails, the others are
  stopped and the whole member is retried.
Retries are the driver's, not Ray's (max_retries=0), because Ray counts a lost node and a crash against one
budget: a member whose node or worker was lost (`preempted_error`: a reclaimed spot VM, a dead worker) or whose
trainer exited with EXIT_PREEMPTED is submitted again without counting against --max_attempts, up to
--max_preemptions times; one whose trainer crashed is submitted again up to --max_attempts attempts in all; a
user error (exit code 2) fails once. Each new attempt resumes from the member's last checkpoint.
The trainer subprocess dies with its Ray worker (runner._die_with_parent), so a cancelled task, a killed
driver or Ctrl-C leaves no trainer behind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from typing import Any, Mapping, Sequence

from grpo_jax import signals, storage
from grpo_jax.persist.layout import RunFiles
from grpo_jax.sweep import progress, runner
from grpo_jax.sweep import spec as spec_lib
from grpo_jax.errors import EXIT_PREEMPTED, UserError

EXTRA_HINT = "--backend=ray needs Ray, an optional extra: pip install -e '.[ray]'"
PROBE_DIR = ".ray_probe"


def import_ray():
  try:
    import ray
  except ImportError:
    raise UserError(EXTRA_HINT) from None
  return ray


def preempted_error(error: BaseException) -> bool:
  """Whether a task's exception means it was lost with its node or worker (a reclaimed VM, a killed worker, an
  owner on a lost node) rather than failed: Ray's NodeDiedError, WorkerCrashedError, LocalRayletDiedError and
  ObjectLostError (OwnerDiedError among them), also as the cause of a RayTaskError."""
  from ray import exceptions as rex
  lost = (rex.NodeDiedError, rex.WorkerCrashedError, rex.LocalRayletDiedError, rex.ObjectLostError)
  return isinstance(error, lost) or isinstance(getattr(error, "cause", None), lost)


@dataclasses.dataclass(frozen=True)
class MemberResources:
  """What one member needs: `per_host` Ray resources ({"GPU": 1}, {"TPU": 4}, {"CPU": 2}) on each of `hosts`
  nodes. Written as one dict where the key "hosts" (default 1) is the number of nodes."""
  per_host: Mapping[str, float]
  hosts: int = 1

  @classmethod
  def parse(cls, value: str | Mapping[str, Any], where: str = "--member_resources") -> "MemberResources":
    if isinstance(value, str):
      try:
        value = json.loads(value)
      except ValueError:
        raise UserError(f"{where}: {value!r} is not JSON; write e.g. '{{\"GPU\": 1}}' or '{{\"TPU\": 4, \"hosts\": 2}}'")
    if not isinstance(value, Mapping) or not value:
      raise UserError(f"{where}: expected a non-empty dict of resources, e.g. {{\"GPU\": 1}}, got {value!r}")
    per_host = dict(value)
    hosts = per_host.pop("hosts", 1)
    if not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1:
      raise UserError(f"{where}: 'hosts' must be an integer >= 1, got {hosts!r}")
    for key, amount in per_host.items():
      if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount <= 0:
        raise UserError(f"{where}: {key!r} must be a number > 0, got {amount!r}")
    per_host.setdefault("CPU", 1)  # the task itself runs a Python process
    return cls(per_host, hosts)

  def task_options(self) -> dict[str, Any]:
    opts: dict[str, Any] = {"num_cpus": self.per_host["CPU"]}
    if "GPU" in self.per_host:
      opts["num_gpus"] = self.per_host["GPU"]
    custom = {k: v for k, v in self.per_host.items() if k not in ("CPU", "GPU")}
    if custom:
      opts["resources"] = custom
    return opts

  def __str__(self) -> str:
    return json.dumps({**self.per_host, **({"hosts": self.hosts} if self.hosts > 1 else {})})


MEMBER_RESOURCES_HINT = ("say what one member needs with --member_resources, e.g. '{\"GPU\": 1}', "
                         "'{\"TPU\": 4}' or '{\"CPU\": 8}'")


def default_resources(nodes: Sequence[Mapping[str, float]], node_types: Sequence[Mapping[str, float]] | None = None,
                      autoscaled: bool = False) -> MemberResources:
  """One GPU per member on a cluster with GPUs; a TPU host's chips on a TPU cluster; else a whole CPU node (XLA
  uses every core of a machine, so two members on one node would only share it).

  What the cluster has: the alive `nodes` and the `node_types` its autoscaler can start (a cluster file's
  available_node_types): at submit time a `ray up` cluster may be only its head, with CPU 0. With an autoscaler
  whose node types are unknown and no accelerator up, or no node that could run a member, it cannot tell: a
  UserError asks for --member_resources rather than members that run on the CPU of a GPU cluster."""
  pool = [dict(n) for n in (node_types or [])] + [dict(n) for n in nodes]
  if any(n.get("GPU", 0) for n in pool):
    return MemberResources({"CPU": 1, "GPU": 1})
  tpus = [n["TPU"] for n in pool if n.get("TPU", 0)]
  if tpus:
    return MemberResources({"CPU": 1, "TPU": max(tpus)})
  cpus = [n["CPU"] for n in pool if n.get("CPU", 0) >= 1]
  if autoscaled and node_types is None:
    raise UserError("the cluster has an autoscaler whose node types this driver cannot read, and no node with a "
                    f"GPU or TPU is up yet; {MEMBER_RESOURCES_HINT}")
  if not cpus:
    raise UserError(f"no node of the cluster can run a member (CPU 0 everywhere); {MEMBER_RESOURCES_HINT}")
  return MemberResources({"CPU": min(cpus)})


def node_types_of_config(config: Mapping[str, Any]) -> list[dict[str, float]] | None:
  """The resources of each node type a cluster file (`ray up`'s YAML) can start; None if a type that can be
  started declares none (Ray would detect them, so they are unknown here)."""
  types = config.get("available_node_types") or {}
  head = config.get("head_node_type")
  out = []
  for name, spec in types.items():
    if name != head and spec.get("max_workers", config.get("max_workers", 1)) == 0:
      continue
    if "resources" not in spec:
      return None
    out.append(dict(spec["resources"]))
  return out or None


BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"


def autoscaling_config_path(gcs_address: str, processes=None) -> str | None:
  """The --autoscaling-config of this cluster's autoscaler (its monitor.py, which `ray up` starts on the head with
  ~/ray_bootstrap_config.yaml), found among this machine's processes by the cluster's GCS address."""
  if processes is None:
    import psutil
    processes = (p.info.get("cmdline") or [] for p in psutil.process_iter(["cmdline"]))
  for cmdline in processes:
    if any(re.search(r"autoscaler[/\\](_private|v2)[/\\]monitor\.py$", a) for a in cmdline) and \
        f"--gcs-address={gcs_address}" in cmdline:
      path = next((a.split("=", 1)[1] for a in cmdline if a.startswith("--autoscaling-config=")), None)
      if path:  # a plain `ray start --head` runs a monitor without one
        return path
  bootstrap = os.path.expanduser(BOOTSTRAP_CONFIG)  # where `ray up` puts it on the head, whatever the address
  return bootstrap if os.path.exists(bootstrap) else None


def cluster_node_types(ray) -> tuple[bool, list[dict[str, float]] | None]:
  """(whether an autoscaler may start nodes, the resources of the node types it can start or None if unknown).

  Ray keeps no cluster file for an open-source autoscaler in 2.60, so the sources are, in order: the cluster
  config an autoscaler reported to the GCS (ray._private.state's get_cluster_config, where one reports it), the
  autoscaling config file of the cluster's autoscaler on this node (a `ray job submit` driver runs on the head);
  KubeRay's environment marks a cluster whose worker groups are not readable from here."""
  try:
    from ray._private.state import state
    config = state.get_cluster_config()
  except Exception:  # noqa: BLE001 (an older or newer Ray without it)
    config = None
  if config is not None and config.node_group_configs:
    return True, [dict(g.resources) for g in config.node_group_configs if g.max_count != 0]
  path = autoscaling_config_path(ray.get_runtime_context().gcs_address)
  if path:
    import yaml
    try:
      with open(os.path.expanduser(path)) as f:
        return True, node_types_of_config(yaml.safe_load(f) or {})
    except (OSError, yaml.YAMLError):
      return True, None
  return any(os.environ.get(k) for k in ("KUBERAY_GEN_RAY_START_CMD", "RAY_CLUSTER_NAME")), None


def visible_devices_env(env: Mapping[str, str], accelerator_ids: Mapping[str, Sequence[str]]) -> dict[str, str]:
  """The trainer's environment: the worker's, with device visibility set to the accelerators Ray assigned."""
  out = dict(env)
  if accelerator_ids.get("GPU"):
    out["CUDA_VISIBLE_DEVICES"] = ",".join(accelerator_ids["GPU"])
  if accelerator_ids.get("TPU"):
    out["TPU_VISIBLE_CHIPS"] = ",".join(accelerator_ids["TPU"])
  return out


def _repo_root() -> str:
  """The directory that holds this copy of grpo_jax/ (a checkout, or a Ray job's working directory)."""
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def portable_path(config_spec: str) -> str:
  """An experiment path the member tasks can open: relative to the repository root when inside it (each node
  runs the trainer there, in its own copy of the code), else absolute."""
  path, colon, preset = config_spec.partition(":")
  absolute = os.path.abspath(path)
  relative = os.path.relpath(absolute, _repo_root())
  return (absolute if relative.startswith("..") else relative) + colon + preset


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("", 0))
    return s.getsockname()[1]


def _trainer_env(ray, rank: int, hosts: int, coordinator: str) -> dict[str, str]:
  env = visible_devices_env(os.environ, ray.get_runtime_context().get_accelerator_ids())
  if hosts > 1:
    env.update(JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=str(hosts), JAX_PROCESS_ID=str(rank))
  return env


def _host_task(workdir: str, args: Sequence[str], train_cmd: Sequence[str] | None, rank: int, hosts: int,
               coordinator: str) -> int:
  """Process `rank` (> 0) of a multi-host member; its output goes to WORKDIR/train.<rank>.log."""
  import ray
  rc, _ = runner.attempt(workdir, list(train_cmd or spec_lib.default_train_cmd()) + list(args), cwd=_repo_root(),
                         env=_trainer_env(ray, rank, hosts, coordinator), log_name=f"train.{rank}.log")
  return rc


def _member_task(m: spec_lib.Member, *, config_spec: str, sweep_dir: str, train_cmd: Sequence[str] | None,
                 common: Mapping[str, Any], skip_failed: bool, resources: MemberResources,
                 pg=None) -> tuple[str, int | None]:
  """One attempt of a member (process 0 of it if multi-host): (outcome, exit code), the outcome as
  runner.record's ('done', 'failed', 'preempted') or prepare's ('skipped-*', exit code None)."""
  import ray
  from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
  cmd = list(train_cmd or spec_lib.default_train_cmd())  # this node's Python and copy of the code
  runner.wait_for_donor(m, sweep_dir)  # members run at once here: a shared warm start may still be on its way
  prepared = runner.prepare(m, config_spec=config_spec, sweep_dir=sweep_dir, train_cmd=cmd, common=common,
                            skip_failed=skip_failed)
  if isinstance(prepared, str):
    return prepared, None
  workdir, argv = prepared
  node = ray.util.get_node_ip_address()
  coordinator = f"{node}:{_free_port()}" if resources.hosts > 1 else ""
  peers = [ray.remote(_host_task).options(
      max_retries=0, **resources.task_options(),
      scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank)).remote(
          workdir, argv[len(cmd):], train_cmd, rank, resources.hosts, coordinator)
           for rank in range(1, resources.hosts)]
  peer_rcs: list[int] = []

  def peer_rc(ref) -> int:
    try:
      return ray.get(ref)
    except Exception as e:  # noqa: BLE001 (the peer's worker or node died: preempted; else a failure)
      return EXIT_PREEMPTED if preempted_error(e) else 1

  def peer_failed() -> bool:
    ready, _ = ray.wait(peers, num_returns=len(peers), timeout=0)
    peer_rcs.extend(rc for rc in map(peer_rc, ready) if rc != 0)
    return bool(peer_rcs)

  rc, offset = runner.attempt(workdir, argv, cwd=_repo_root(), node=node,
                              env=_trainer_env(ray, 0, resources.hosts, coordinator),
                              abort=peer_failed if peers else None)
  if peers:
    if rc != 0:
      for ref in peers:
        ray.cancel(ref, force=True)
    else:
      peer_rcs.extend(r for r in map(peer_rc, peers) if r != 0)
    rc = peer_rcs[0] if peer_rcs else rc  # the member ends as its first failed process did
  return runner.record(m, workdir, rc, offset), rc


def check_shared_dir(ray, sweep_dir: str, timeout_s: float = 120.0) -> None:
  """Before any member starts: a task on every node writes a file into SWEEP_DIR, and the driver must read it
  back. Members on several nodes write their workdirs there, so it must be storage every node mounts."""
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
  probe_dir = storage.join(sweep_dir, PROBE_DIR)
  token = uuid.uuid4().hex
  nodes = [n for n in ray.nodes() if n.get("Alive")]

  def write(path: str, text: str) -> str:  # a gs:// or s3:// sweep directory: through the node's credentials
    # (Ray pickles `storage` by name: the node imports its own grpo_jax.storage, with the node's clients.)
    storage.write_text(path, text)
    return socket.gethostname()

  writer = ray.remote(write)
  refs = {n["NodeManagerAddress"]: writer.options(
      num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
          storage.join(probe_dir, n["NodeID"]), token) for n in nodes}
  errors = {}
  for address, ref in refs.items():
    try:
      ray.get(ref, timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 (any failure to write is the finding)
      errors[address] = f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"
  verify_probes(sweep_dir, {n["NodeManagerAddress"]: n["NodeID"] for n in nodes}, token, errors)


def verify_probes(sweep_dir: str, nodes: Mapping[str, str], token: str, errors: Mapping[str, str]) -> None:
  """Raises a UserError naming the nodes whose probe file (PROBE_DIR/<node id>, holding `token`) the driver
  cannot read; removes the probe files otherwise."""
  probe_dir = storage.join(sweep_dir, PROBE_DIR)
  missing = []
  for address, node_id in nodes.items():
    path = storage.join(probe_dir, node_id)
    try:
      ok = storage.read_text(path) == token
    except OSError:
      ok = False
    if not ok:
      missing.append(address + (f" ({errors[address]})" if address in errors else ""))
  if missing:
    raise UserError(f"--sweep_dir {sweep_dir}: what a Ray worker writes there does not reach this driver (nodes "
                    f"{', '.join(missing)}); put the sweep directory on storage every node mounts (NFS) at the same "
                    "path, or on gs:// or s3:// with credentials on every node")
  for node_id in nodes.values():
    with contextlib.suppress(OSError):
      storage.remove(storage.join(probe_dir, node_id))


def run_members(members: Sequence[spec_lib.Member], *, config_spec: str, sweep_dir: str,
                train_cmd: Sequence[str] | None, common: Mapping[str, Any] | None = None, skip_failed: bool = False,
                max_attempts: int = 3, max_preemptions: int = runner.MAX_PREEMPTIONS,
                resources: MemberResources | None = None, address: str | None = None, poll_s: float = 2.0,
                echo=print, init_kwargs: Mapping[str, Any] | None = None) -> dict[str, str]:
  """Runs the members as Ray tasks on the cluster at `address` (None: a local Ray instance); returns
  name -> outcome as the local runner does. Shows a live status line and, at the end, a summary table."""
  ray = import_ray()
  from ray.util.placement_group import placement_group, remove_placement_group
  from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
  sweep_dir = storage.absolute(sweep_dir)
  config_spec = portable_path(config_spec)
  started = time.time()
  # Absent: the cluster of the Ray job this driver runs in (RAY_ADDRESS), else a new local instance of our own
  # ("local"), never one that an earlier `ray start` left running on this machine.
  ray.init(address=address or os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False, **(init_kwargs or {}))
  outcomes: dict[str, str] = {}
  refs: dict[Any, spec_lib.Member] = {}  # the attempts in flight
  groups: dict[str, Any] = {}
  ends: dict[str, dict[str, int]] = {}  # each member's attempts' outcomes, for runner.retry
  try:
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if resources is None:
      autoscaled, node_types = cluster_node_types(ray)
      resources = default_resources(nodes, node_types, autoscaled)
    echo(f"[sweep] Ray at {ray.get_runtime_context().gcs_address}: {len(nodes)} node(s), "
         f"{ {k: v for k, v in ray.cluster_resources().items() if k in ('CPU', 'GPU', 'TPU')} }; "
         f"each member needs {resources}")
    if not any(all(n.get(k, 0) >= v for k, v in resources.per_host.items()) for n in nodes):
      echo(f"[sweep] warning: no node has {dict(resources.per_host)} now; members wait until one joins")
    check_shared_dir(ray, sweep_dir)
    task = ray.remote(_member_task)

    def submit(m: spec_lib.Member, skip: bool) -> None:
      # Ray retries nothing itself (max_retries=0): the loop below tells preemptions from failures.
      opts = dict(max_retries=0, **resources.task_options())
      if resources.hosts > 1:
        if m.name not in groups:
          groups[m.name] = placement_group([dict(resources.per_host)] * resources.hosts, strategy="STRICT_SPREAD")
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(groups[m.name], placement_group_bundle_index=0)
      refs[task.options(**opts).remote(m, config_spec=config_spec, sweep_dir=sweep_dir, train_cmd=train_cmd,
                                       common=dict(common or {}), skip_failed=skip, resources=resources,
                                       pg=groups.get(m.name))] = m

    for m in members:
      if runner.status(runner.member_dir(sweep_dir, m)) == "done":
        outcomes[m.name] = "skipped-done"
      else:
        submit(m, skip_failed)
    live = progress.LiveLine(echo)
    with _sigint_flag() as interrupted:
      while refs and not interrupted.is_set():
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=poll_s)
        for ref in ready:
          m = refs.pop(ref)
          workdir = runner.member_dir(sweep_dir, m)
          try:
            outcome, rc = ray.get(ref)
          except Exception as e:  # noqa: BLE001 (the task was lost with its worker or node, or broke)
            outcome, rc = ("preempted" if preempted_error(e) else "failed"), None
            _end_lost_attempt(workdir, outcome, e)
          outcome = runner.retry(m, workdir, outcome, rc, ends.setdefault(m.name, {}), max_attempts, max_preemptions,
                                 echo)
          if outcome:
            outcomes[m.name] = outcome
          else:
            submit(m, False)
        live.show(progress.read_members(sweep_dir, members, outcomes))
      if interrupted.is_set():
        raise KeyboardInterrupt("SIGINT")
    live.end()
  except KeyboardInterrupt:
    echo("[sweep] interrupted: stopping every member (they resume when the sweep is started again)")
    for ref in refs:
      ray.cancel(ref, force=True, recursive=True)
    raise
  finally:
    for pg in groups.values():
      with contextlib.suppress(Exception):  # the cluster may be gone
        remove_placement_group(pg)
    ray.shutdown()
  echo(progress.summary_table(progress.read_members(sweep_dir, members, outcomes), time.time() - started))
  return {m.name: outcomes[m.name] for m in members}


def _end_lost_attempt(workdir: str, outcome: str, error: Exception) -> None:
  """The end row of an attempt whose task was lost (its worker or node died) or broke, and FAILED for the
  latter (no attempt wrote it). A killed worker writes no end row: this one's time runs until the driver learned
  of the loss. A worker stopped by SIGTERM (a node shutting down) ended its attempt itself: preempted if its
  trainer saved its step (exit code 75), else a row with no time of its own records the preemption."""
  storage.makedirs(workdir)
  path = RunFiles(workdir).attempts
  rows = runner.read_jsonl(path)
  ended = {r.get("start"): r for r in rows if "rc" in r}
  start = next((r["start"] for r in reversed(rows) if "rc" not in r and r.get("start") not in ended), None)
  last = rows[-1] if rows and "rc" in rows[-1] else None
  message = f"{type(error).__name__}: {error}"[-4000:]
  if not (start is None and last is not None and last.get("outcome") == outcome):  # else it recorded its own end
    wall_s = time.time() - start if start is not None else 0.0
    runner.append_jsonl(path, {"start": start if start is not None else (last or {}).get("start"), "wall_s": wall_s,
                               "rc": None, "outcome": outcome, "error": message.splitlines()[0][:300]})
  if outcome == "failed" and runner.status(workdir) not in ("done", "failed"):
    runner.mark_failed(workdir, None, message)


@contextlib.contextmanager
def _sigint_flag():
  """Ctrl-C sets the yielded Event instead of raising KeyboardInterrupt wherever the main thread happens to be.
  Raised there, it was lost twice in full test-suite runs (the driver went on and every member finished;
  Python drops exceptions raised inside finalizers, which Ray's object references run on the main thread);
  a flag the loop reads after each `ray.wait` cannot be lost. Off the main thread: no handler."""
  flag = threading.Event()
  with signals.handled(lambda signum, frame: flag.set(), (signal.SIGINT,)):
    yield flag
