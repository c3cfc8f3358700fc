"""The cluster files of clusters/ and the cost script of docs/cloud.md.

Every clusters/*.yaml parses. The `ray up` files pass Ray's own cluster-config validation (its defaults merged
in, then ray-schema.json) and the facts docs/cloud.md relies on: every node installs this package with the
extras its role needs, every node mounts the shared sweep directory at the same path, each worker type declares
the accelerators its machine has, and the `--member_resources` of the page's section on the file fit a worker
type. The KubeRay file: a RayCluster whose every pod mounts the same ReadWriteMany claim, GPU limits on the
workers, Ray's version that of constraints.txt. scripts/study_cost.py: hand-computed examples (on-demand, and
spot with the cost of preemptions), spot printed beside on-demand with the prices' source and date, a mistake
as one line and exit 2, and the page's tables are the script's output.
"""
import configparser
import copy
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from grpo_jax.sweep.ray_backend import MemberResources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTERS = sorted(glob.glob(os.path.join(ROOT, "clusters", "*.yaml")))
DOC = os.path.join(ROOT, "docs", "cloud.md")
SHARED = "/mnt/shared"   # the sweep directories' parent on every node (docs/cloud.md)

_spec = importlib.util.spec_from_file_location("study_cost", os.path.join(ROOT, "scripts", "study_cost.py"))
study_cost = sys.modules["study_cost"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up there
_spec.loader.exec_module(study_cost)


def _load(path):
  with open(path) as f:
    return list(yaml.safe_load_all(f))


def _ray_up_files():
  return [p for p in CLUSTERS if "provider" in _load(p)[0]]


def _kuberay_files():
  return [p for p in CLUSTERS if _load(p)[0].get("apiVersion") and "provider" not in _load(p)[0]]


def _doc():
  with open(DOC) as f:
    return f.read()


def _doc_sections():
  """docs/cloud.md's `## ` sections: heading -> text."""
  parts = re.split(r"^## ", _doc(), flags=re.M)[1:]
  return {p.split("\n", 1)[0]: p for p in parts}


def _member_resources_for(path):
  """The --member_resources of the docs/cloud.md section whose heading names this cluster file."""
  name = "clusters/" + os.path.basename(path)
  sections = [text for heading, text in _doc_sections().items() if name in heading]
  assert len(sections) == 1, f"docs/cloud.md needs one section whose heading names {name}"
  found = re.findall(r"--member_resources='([^']*)'", sections[0])
  assert found, f"docs/cloud.md's section on {name} gives no --member_resources"
  return [MemberResources.parse(text) for text in found]


def _setup_cfg_extras():
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(ROOT, "setup.cfg"))
  return set(cfg["options.extras_require"])


def _ray_pin():
  with open(os.path.join(ROOT, "constraints.txt")) as f:
    pins = re.findall(r"^ray==(\S+)$", f.read(), flags=re.M)
  assert len(pins) == 1, "constraints.txt must pin ray exactly once (the clusters install that version)"
  return pins[0]


def test_every_cluster_file_parses_and_is_covered_by_the_doc():
  assert {os.path.basename(p) for p in CLUSTERS} >= {"gcp_gpu.yaml", "gcp_tpu.yaml", "kuberay.yaml"}
  doc = _doc()
  for path in CLUSTERS:
    documents = _load(path)
    assert documents and all(isinstance(d, dict) for d in documents), path
    assert path in _ray_up_files() + _kuberay_files(), f"{path}: neither a `ray up` file nor a Kubernetes one"
    assert "clusters/" + os.path.basename(path) in doc, f"docs/cloud.md does not mention {path}"
  for path in _ray_up_files():
    assert len(_load(path)) == 1, f"{path}: `ray up` reads one YAML document"


# ---------------------------------------------------------------------------------------------------- ray up


@pytest.mark.parametrize("path", _ray_up_files(), ids=os.path.basename)
def test_ray_up_file_passes_rays_validation(path):
  util = pytest.importorskip("ray.autoscaler._private.util", reason="Ray is an optional extra (.[ray])")
  pytest.importorskip("jsonschema", reason="Ray validates cluster files with jsonschema")
  config = _load(path)[0]
  # What `ray up` does before it talks to the cloud: merge the provider's defaults, then check the schema.
  util.validate_config(util.prepare_config(copy.deepcopy(config)))


def _pinned_set(config):
  """The pinned set every node of a cluster installs at: its workers' (GPU or TPU nodes, Python 3.12)."""
  kinds = {_accelerator(s["node_config"]) for t, s in config["available_node_types"].items()
           if t != config["head_node_type"]}
  assert len(kinds) == 1, f"workers of one kind per cluster file, not {kinds}"
  return {"gpu": "constraints/gpu-py312.txt", "tpu": "constraints/tpu-py312.txt"}[kinds.pop()]


def _node_commands(config, node_type):
  """The commands `ray up` runs on a node of this type (a type's own worker_setup_commands replace the rest)."""
  if node_type == config["head_node_type"]:
    return config.get("setup_commands", []) + config.get("head_setup_commands", [])
  own = config["available_node_types"][node_type].get("worker_setup_commands")
  if own is not None:
    return own
  return config.get("setup_commands", []) + config.get("worker_setup_commands", [])


def _accelerator(node_config):
  if "acceleratorType" in node_config or "acceleratorConfig" in node_config:
    return "tpu"
  return "gpu" if _gpus_of_machine(node_config) else "cpu"


# NVIDIA GPUs per accelerator-optimized machine type; "-Ng" types (a2, a3) carry N in their name.
_G2_GPUS = {"g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1, "g2-standard-32": 1,
            "g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8}


def _gpus_of_machine(node_config):
  machine = node_config.get("machineType", "")
  attached = sum(int(a.get("acceleratorCount", 0)) for a in node_config.get("guestAccelerators", []))
  if machine in _G2_GPUS:
    return _G2_GPUS[machine]
  match = re.fullmatch(r"a[234]-\w+-(\d+)g", machine)
  if match:
    return int(match.group(1))
  assert not re.match(r"(a\d|g\d)-", machine), f"{machine}: add its GPU count to this test's table"
  return attached


@pytest.mark.parametrize("path", _ray_up_files(), ids=os.path.basename)
def test_every_node_installs_the_package_with_its_extras(path):
  config = _load(path)[0]
  known = _setup_cfg_extras()
  tarballs = [remote for remote, local in config.get("file_mounts", {}).items() if local.endswith(".tar.gz")]
  assert tarballs, "the file must mount the tarball of the commit (git archive) on every node"
  for node_type, spec in config["available_node_types"].items():
    commands = _node_commands(config, node_type)
    text = "\n".join(commands)
    installs = re.findall(r'pip install\b[^\n]*?-e\s+"?\$HOME/grpo_jax\[([\w,]+)\]', text)
    assert len(installs) == 1, f"{node_type}: expected one `pip install ... -e $HOME/grpo_jax[extras]`"
    extras = set(installs[0].split(","))
    assert extras <= known, f"{node_type}: extras {sorted(extras - known)} are not in setup.cfg"
    assert "ray" in extras, f"{node_type}: every node runs Ray: the `ray` extra"
    unpack = [c for c in commands if re.search(r"tar -xzf (\S+) -C ~/grpo_jax", c)]
    assert unpack and re.search(r"tar -xzf (\S+)", unpack[0]).group(1) in tarballs, \
        f"{node_type}: must unpack the mounted tarball into ~/grpo_jax"
    assert commands.index(unpack[0]) < next(i for i, c in enumerate(commands) if "grpo_jax[" in c), \
        f"{node_type}: unpacks the code after installing it"
    pinned = re.findall(r"pip install\b[^\n]*?-c ~/grpo_jax/(\S+)", text)
    assert pinned == [_pinned_set(config)], f"{node_type}: install with -c ~/grpo_jax/{_pinned_set(config)}"
    if node_type == config["head_node_type"]:
      assert "google-api-python-client" in text, "the head's autoscaler needs Google's API client"
      continue
    kind = _accelerator(spec["node_config"])
    wanted = {"gpu": {"cuda12", "cuda13"}, "tpu": {"tpu"}, "cpu": set()}[kind]
    if wanted:
      assert extras & wanted, f"{node_type} ({kind}): install one of the extras {sorted(wanted)}"


@pytest.mark.parametrize("path", _ray_up_files(), ids=os.path.basename)
def test_every_node_mounts_the_shared_directory_at_the_same_path(path):
  config = _load(path)[0]
  for node_type in config["available_node_types"]:
    text = "\n".join(_node_commands(config, node_type))
    mounts = re.findall(r"mount -t nfs\b[^\n]*?\s(\S+:/\S*)\s+(/\S+?)\)?(?:\s|$)", text)
    assert len(mounts) == 1, f"{node_type}: expected one NFS mount, found {mounts}"
    assert mounts[0][1] == SHARED, f"{node_type}: mounts the share at {mounts[0][1]}, not {SHARED}"
    assert f"mountpoint -q {SHARED}" in text, f"{node_type}: mount only when not mounted (ray up runs twice)"
  assert len({m for n in config["available_node_types"]
              for m in re.findall(r"\s(\S+:/\S*)\s+" + SHARED, "\n".join(_node_commands(config, n)))}) == 1, \
      "every node must mount the same share"


def test_the_doc_puts_every_sweep_directory_on_the_shared_path():
  dirs = re.findall(r"--sweep_dir\s+(\S+)", _doc())
  assert dirs
  for d in dirs:
    assert d.startswith((SHARED + "/", "gs://", "s3://")), \
        f"docs/cloud.md: --sweep_dir {d} is neither under {SHARED} nor on a store"


@pytest.mark.parametrize("path", _ray_up_files(), ids=os.path.basename)
def test_worker_types_declare_the_accelerators_of_their_machines(path):
  config = _load(path)[0]
  workers = {t: s for t, s in config["available_node_types"].items() if t != config["head_node_type"]}
  assert workers
  for node_type, spec in workers.items():
    resources, node_config = spec["resources"], spec["node_config"]
    assert resources.get("CPU", 0) >= 1, f"{node_type}: declare CPUs (a member's task takes one)"
    if _accelerator(node_config) == "tpu":
      tpu = pytest.importorskip("ray._private.accelerators.tpu", reason="Ray's TPU table (.[ray])")
      accelerator = node_config["acceleratorType"]
      assert tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_type(accelerator), accelerator
      # Ray starts each node with the declared resources: TPU must be the chips one host sees.
      assert resources.get("TPU") == tpu.get_num_tpu_visible_chips_per_host(accelerator), \
          f"{node_type}: {accelerator} has {tpu.get_num_tpu_visible_chips_per_host(accelerator)} chips per host"
      assert "GPU" not in resources
    else:
      assert resources.get("GPU", 0) == _gpus_of_machine(node_config), \
          f"{node_type}: {node_config.get('machineType')} has {_gpus_of_machine(node_config)} GPU(s)"


def _hosts_of(node_config):
  """Hosts one node of this type brings (a multi-host TPU slice: several)."""
  if "acceleratorType" not in node_config:
    return 1
  from ray._private.accelerators import tpu
  accelerator = node_config["acceleratorType"]
  return tpu.get_total_chips_from_accelerator_type(accelerator) // tpu.get_num_tpu_visible_chips_per_host(
      accelerator)


@pytest.mark.parametrize("path", _ray_up_files(), ids=os.path.basename)
def test_the_docs_member_resources_fit_a_worker_type(path):
  config = _load(path)[0]
  workers = {t: s for t, s in config["available_node_types"].items() if t != config["head_node_type"]}
  if any("acceleratorType" in s["node_config"] for s in workers.values()):
    pytest.importorskip("ray._private.accelerators.tpu", reason="Ray's TPU table (.[ray])")
  for member in _member_resources_for(path):
    fits = []
    for node_type, spec in workers.items():
      if not all(spec["resources"].get(k, 0) >= v for k, v in member.per_host.items()):
        continue
      hosts = _hosts_of(spec["node_config"])
      # One multi-host slice holds the member, or enough single-host workers do.
      if hosts == member.hosts or (hosts == 1 and spec.get("max_workers", config["max_workers"]) >= member.hosts):
        fits.append(node_type)
    assert fits, f"{path}: no worker type offers {member} (docs/cloud.md)"
    if member.hosts > 1:
      # The processes of one member must stay on hosts of one slice: ask for a resource only slice hosts have.
      assert all(_hosts_of(workers[t]["node_config"]) == member.hosts for t in fits), \
          f"{member} also fits single-host workers: its processes could land on separate TPU VMs"


# ---------------------------------------------------------------------------------------------------- KubeRay


def _pod_specs(cluster):
  spec = cluster["spec"]
  groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]
  return [(name, group["template"]["spec"]) for name, group in groups]


@pytest.mark.parametrize("path", _kuberay_files(), ids=os.path.basename)
def test_kuberay_cluster_mounts_one_shared_claim_everywhere(path):
  documents = _load(path)
  clusters = [d for d in documents if d.get("kind") == "RayCluster"]
  assert len(clusters) == 1 and clusters[0]["apiVersion"] == "ray.io/v1", "one RayCluster of ray.io/v1"
  claims = {d["metadata"]["name"]: d for d in documents if d.get("kind") == "PersistentVolumeClaim"}
  assert claims, "the shared directory needs a PersistentVolumeClaim"
  for name, claim in claims.items():
    assert claim["apiVersion"] == "v1"
    assert "ReadWriteMany" in claim["spec"]["accessModes"], f"{name}: pods on several nodes mount it"
  used = set()
  for group, pod in _pod_specs(clusters[0]):
    volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", [])
               if "persistentVolumeClaim" in v}
    assert pod["containers"], group
    for container in pod["containers"]:
      mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
      assert SHARED in mounts, f"{group}/{container['name']}: does not mount {SHARED}"
      assert mounts[SHARED] in volumes, f"{group}: {SHARED} is not a claim's volume"
      assert volumes[mounts[SHARED]] in claims, f"{group}: claim {volumes[mounts[SHARED]]} is not in the file"
      used.add(volumes[mounts[SHARED]])
  assert len(used) == 1, f"every pod must mount the same claim at {SHARED}, found {sorted(used)}"


def _limits(container):
  resources = container.get("resources", {})
  return resources.get("limits", {}), resources.get("requests", {})


def _cpus(quantity):
  text = str(quantity)
  return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@pytest.mark.parametrize("path", _kuberay_files(), ids=os.path.basename)
def test_kuberay_workers_offer_the_docs_member_resources(path):
  cluster = next(d for d in _load(path) if d.get("kind") == "RayCluster")
  workers = []
  for group in cluster["spec"]["workerGroupSpecs"]:
    limits, requests = _limits(group["template"]["spec"]["containers"][0])
    if "nvidia.com/gpu" in limits:
      assert str(requests.get("nvidia.com/gpu")) == str(limits["nvidia.com/gpu"]), \
          f"{group['groupName']}: Kubernetes wants GPU requests equal to limits"
    assert group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"], group["groupName"]
    workers.append({"CPU": _cpus(limits.get("cpu", 0)), "GPU": int(limits.get("nvidia.com/gpu", 0)),
                    "max": group["maxReplicas"]})
  assert any(w["GPU"] >= 1 for w in workers), "no worker group has nvidia.com/gpu limits"
  for member in _member_resources_for(path):
    assert set(member.per_host) <= {"CPU", "GPU"}, f"{member}: KubeRay's pods offer CPU and GPU only here"
    assert any(w["CPU"] >= member.per_host.get("CPU", 0) and w["GPU"] >= member.per_host.get("GPU", 0)
               and w["max"] >= member.hosts for w in workers), f"no worker group offers {member}"


@pytest.mark.parametrize("path", _kuberay_files(), ids=os.path.basename)
def test_kuberay_runs_the_ray_of_constraints(path):
  cluster = next(d for d in _load(path) if d.get("kind") == "RayCluster")
  pin = _ray_pin()
  assert cluster["spec"]["rayVersion"] == pin
  for group, pod in _pod_specs(cluster):
    for container in pod["containers"]:
      image = container["image"]
      assert image.startswith(f"rayproject/ray:{pin}-py312"), \
          f"{group}: {image} is not Ray {pin} on Python 3.12 (jax 0.11 needs it)"


# ---------------------------------------------------------------------------------------------------- costs


def test_study_cost_matches_a_hand_computed_example():
  # 40 members x (500 steps x 6.1 s + 60 s) = 40 x 3110 s = 124,400 s = 34.5556 node-hours at one member per
  # node; at $2/node-hour $69.11; 8 nodes: 5 waves of 3110 s = 4.3194 h, all 8 nodes busy throughout.
  member_s = study_cost.member_seconds(steps=500, step_s=6.1, overhead_s=60)
  assert member_s == pytest.approx(3110)
  e = study_cost.estimate(members=40, member_s=member_s, price=2.0, per_node=1, nodes=8)
  assert e.node_hours == pytest.approx(124400 / 3600)
  assert e.waves == 5
  assert e.wall_h == pytest.approx(5 * 3110 / 3600)
  assert e.cost_busy == pytest.approx(69.1111, abs=1e-3)
  assert e.cost_held == pytest.approx(69.1111, abs=1e-3)
  # 10 members of 1 h, 2 per node, 2 nodes: 5 node-hours busy; 3 waves (4, 4, 2) of 1 h; a $0.5 head for 3 h.
  e = study_cost.estimate(members=10, member_s=3600, price=1.5, per_node=2, nodes=2, head_price=0.5)
  assert (e.node_hours, e.waves, e.wall_h) == (pytest.approx(5.0), 3, pytest.approx(3.0))
  assert e.cost_busy == pytest.approx(5 * 1.5 + 3 * 0.5)
  assert e.cost_held == pytest.approx(2 * 3 * 1.5 + 3 * 0.5)
  # A member costs 3110 s x $2/h = $1.7278; at $0.5/h that buys 12,440 s, i.e. (12440 - 60) / 500 = 24.76 s/step.
  assert study_cost.break_even_step_s(3110, 2.0, 0.5, steps=500, overhead_s=60) == pytest.approx(24.76)
  with pytest.raises(ValueError):
    study_cost.member_seconds(steps=500, step_s=6.1, member_s=100)


def test_study_cost_prints_the_table(capsys):
  assert study_cost.main(["--members", "40", "--steps", "500", "--step_s", "6.1", "--overhead_s", "60",
                          "--nodes", "8", "--price", "x=2", "--compare", "y=0.5"]) == 0
  out = capsys.readouterr().out
  assert "| x | 2 | 34.6 | 4h19m | $69.11 | $69.11 |" in out
  assert "| y | 0.5 | 24.8 s per step (4.1x the measured 6.1 s) |" in out


def _doc_cost_commands():
  """The study_cost.py commands of docs/cloud.md (continuation lines joined)."""
  text = _doc().replace("\\\n", " ")
  return [line.strip() for line in text.splitlines() if line.strip().startswith("python scripts/study_cost.py")]


def test_the_docs_cost_tables_are_the_scripts_output():
  commands = _doc_cost_commands()
  assert len(commands) >= 2, "docs/cloud.md gives the commands of its cost tables"
  doc = _doc()
  for command in commands:
    argv = shlex.split(command)[1:]
    out = subprocess.run([sys.executable] + argv, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
      if line.strip():
        assert line in doc, f"docs/cloud.md lacks this line of `{command[:60]}...`: {line}"


def test_study_cost_needs_no_jax():
  code = ("import runpy, sys; runpy.run_path('scripts/study_cost.py', run_name='cost'); "
          "sys.exit(1 if 'jax' in sys.modules or 'numpy' in sys.modules else 0)")
  assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_study_cost_preemptions_match_a_hand_computed_example():
  # 10 s steps, a checkpoint every 100: a preemption loses half a step (5 s) when the trainer saves on SIGTERM,
  # half a checkpoint interval (500 s) when it does not.
  assert study_cost.lost_work_s(10, 100, saves_on_sigterm=True) == pytest.approx(5)
  assert study_cost.lost_work_s(10, 100, saves_on_sigterm=False) == pytest.approx(500)
  # 0.5 preemptions per node-hour, 600 s to restart: 0.5 x 605 / 3600 = 8.403% more node time when saved,
  # 0.5 x 1100 / 3600 = 15.278% when not. 10 node-hours at $1 spot: $10.84 and $11.53.
  saved = study_cost.preemption_overhead(0.5, 600, 5)
  unsaved = study_cost.preemption_overhead(0.5, 600, 500)
  assert saved == pytest.approx(0.084028, abs=1e-6)
  assert unsaved == pytest.approx(0.152778, abs=1e-6)
  assert study_cost.spot_cost(10, 1.0, saved) == pytest.approx(10.8403, abs=1e-4)
  assert study_cost.spot_cost(10, 1.0, unsaved) == pytest.approx(11.5278, abs=1e-4)
  # Against $3 on-demand, spot at $1 stays cheaper while 1 + r x 605 / 3600 < 3: r < 2 x 3600 / 605 = 11.90.
  assert study_cost.break_even_preemptions_per_h(3.0, 1.0, 600, 5) == pytest.approx(11.9008, abs=1e-4)
  assert study_cost.break_even_preemptions_per_h(1.0, 1.0, 600, 5) == 0      # spot no cheaper: never worth it
  assert study_cost.break_even_preemptions_per_h(3.0, 1.0, 0, 0) == float("inf")
  with pytest.raises(ValueError):
    study_cost.preemption_overhead(-0.1, 600, 5)


def test_study_cost_prints_spot_beside_on_demand_with_source_and_date(capsys):
  assert study_cost.main(["--members", "40", "--steps", "500", "--step_s", "6.1", "--overhead_s", "60",
                          "--nodes", "8", "--price", "x=2", "--spot_price", "x=0.6",
                          "--node", "a3-highgpu-1g/us-central1", "--preemptions_per_h", "0.1",
                          "--restart_s", "300"]) == 0
  out = capsys.readouterr().out
  # 34.556 node-hours; 0.1 x (300 + 3.05) / 3600 = 0.842% more when saved, 0.1 x 605 / 3600 = 1.681% when not.
  assert "| x | 2 | 0.6 | command line | $69.11 | $20.91 (preemptions $0.17) | $21.08 (preemptions $0.35) | " \
         "27.7 preemptions per node-hour |" in out
  label, price, spot, source, read = study_cost.PUBLISHED["a3-highgpu-1g/us-central1"]
  row = [line for line in out.splitlines() if line.startswith(f"| {label} | {price:g} | {spot:g} | ")]
  assert row and f"{source}, read {read}" in row[0], out
  # The built-in list: every published spot price below its on-demand one, each with its source and date.
  assert study_cost.main(["--list_prices"]) == 0
  listed = capsys.readouterr().out
  for key, (label, price, spot, source, read) in study_cost.PUBLISHED.items():
    assert 0 < spot < price and re.fullmatch(r"\d{4}-\d{2}-\d{2}", read) and source
    assert f"| {key} | {label} | {price:g} | {spot:g} | " in listed


@pytest.mark.parametrize("argv", [
    ["--members", "4", "--steps", "5", "--step_s", "1", "--price", "x=abc"],           # not a number
    ["--members", "4", "--steps", "5", "--step_s", "1", "--price", "x=1", "--spot_price", "y=0.5"],  # no such row
    ["--members", "4", "--steps", "5", "--step_s", "1", "--price", "x=1", "--spot_price", "x=0.5"],  # no rate
    ["--members", "4", "--steps", "5", "--step_s", "1", "--node", "a3-highgpu-1g"],   # not a key
    ["--members", "4", "--steps", "5", "--step_s", "1", "--price", "x=1", "--bogus"],
    ["--steps", "5", "--step_s", "1", "--price", "x=1"],                               # no --members
    ["--members", "4", "--steps", "5", "--step_s", "1", "--price", "x=1", "--restart_s", "60"],  # no spot price
])
def test_study_cost_bad_argument_exits_2_with_one_line(argv):
  r = subprocess.run([sys.executable, "scripts/study_cost.py"] + argv, cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
  assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("study_cost.py: error: "), r.stderr


def _spot_section():
  sections = [text for heading, text in _doc_sections().items() if heading.strip() == "On spot capacity"]
  assert len(sections) == 1, "docs/cloud.md needs one section 'On spot capacity'"
  return sections[0]


def test_the_docs_spot_snippets_parse_and_fit_the_cluster_files():
  text = _spot_section()
  blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)]
  # Compute Engine: a Spot VM can neither restart by itself nor live-migrate.
  gcp = [b["scheduling"] for b in blocks if "scheduling" in b]
  assert len(gcp) == 1 and gcp[0]["provisioningModel"] == "SPOT"
  assert gcp[0]["automaticRestart"] is False and gcp[0]["onHostMaintenance"] == "TERMINATE"
  # The TPU worker asks for the accelerator and software of clusters/gcp_tpu.yaml's tpu_host, preemptible.
  tpu = [b["node_config"] for b in blocks if "schedulingConfig" in b.get("node_config", {})]
  host = _load(os.path.join(ROOT, "clusters", "gcp_tpu.yaml"))[0]["available_node_types"]["tpu_host"]["node_config"]
  assert len(tpu) == 1 and tpu[0]["schedulingConfig"]["preemptible"] is True
  assert {k: tpu[0][k] for k in ("acceleratorType", "runtimeVersion")} == \
         {k: host[k] for k in ("acceleratorType", "runtimeVersion")}
  aws = [b["node_config"] for b in blocks if "InstanceMarketOptions" in b.get("node_config", {})]
  assert len(aws) == 1 and aws[0]["InstanceMarketOptions"]["MarketType"] == "spot"
  # The GKE worker group: the file's node selector plus the Spot label, as strings (Kubernetes refuses a YAML
  # boolean there), and a grace period longer than the checkpoint deadline the page tells the study to use.
  pods = [b["spec"] for b in blocks if "nodeSelector" in b.get("spec", {})]
  assert len(pods) == 1
  worker = next(o for o in _load(os.path.join(ROOT, "clusters", "kuberay.yaml")) if o.get("kind") == "RayCluster")
  file_selector = worker["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
  assert pods[0]["nodeSelector"] == dict(file_selector, **{"cloud.google.com/gke-spot": "true"})
  deadline = int(re.search(r"--set checkpoint\.preemption_deadline_s=(\d+)", text).group(1))
  assert deadline < pods[0]["terminationGracePeriodSeconds"]
