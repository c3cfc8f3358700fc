"""The default experiment's behaviour as one digest: its metrics (timings aside) and its final parameters.

  python -m tests.train.default_fingerprint [--full] [--record] [--out FILE]

prints this CPU's digests of the default experiment cut short (or, with --full, of the default experiment as it
is: 500 steps, a few minutes), with --record stores them in default_fingerprint.json, and with --out writes
them to FILE as JSON.

Recorded before the train/ redesign (issue 30), so that test_default_fingerprint.py can check, bit for bit, that
a refactor changed no number. XLA's CPU code depends on the CPU's vector instructions, so digests are stored per
CPU signature; a CPU without a record gets none compared (the test says so).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RECORD = os.path.join(HERE, "default_fingerprint.json")
TIMING = ("step_time", "tokens_per_s")
# Metrics added after the digests were recorded: new numbers, not changed ones, so left out of the digest.
ADDED_SINCE_RECORD = ("eval/full_credit", "rollout/staleness", "offpolicy/ratio", "offpolicy/ratio_std",
                      "sampling/slot_utilization")


def cpu_signature() -> str:
  """Machine, CPU model and the vector-instruction flags XLA's CPU compiler uses."""
  model, flags = "unknown", []
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
          model = value.strip()
        elif key.strip() == "flags":
          flags = sorted(x for x in value.split() if x.startswith(("avx", "fma", "amx", "sse4")))
          break
  except OSError:
    pass
  return f"{platform.machine()} | {model} | {' '.join(flags)}"


def variants(workdir: str, full: bool = False):
  """name -> config: the default experiment (full: as it is, 500 steps; else cut to 100 warm-start and 20 GRPO
  steps, under a minute), then the paths the default does not take, from the same warm start
  (`warmstart.init_checkpoint`): LoRA adapters with a reference model (beta 0.04)."""
  from tests.train.conftest import load_experiment

  def default():
    c = load_experiment("default")()
    if not full:
      c.num_steps, c.eval.every, c.checkpoint.every, c.log.samples_every = 20, 10, 10, 10
      c.warmstart.max_steps, c.warmstart.eval_every = 100, 25
    c.log.progress_bar = False
    return c

  def lora_beta():
    c = default()
    c.grpo.beta = 0.04
    c.model.lora_rank = 8
    c.optim.learning_rate = 1e-3
    c.warmstart.init_checkpoint = os.path.join(workdir, "default")
    return c

  return {"default": default, "lora_beta": lora_beta}


def digest(workdir: str) -> str:
  """sha256 of metrics.jsonl's rows without timings, and of the last checkpoint's state fingerprint."""
  rows = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      rows.append({k: v for k, v in row.items()
                   if k not in TIMING + ADDED_SINCE_RECORD and not k.startswith("timing/")
                   and not k.endswith(("/lo", "/hi"))})  # intervals: added since, computed from the recorded
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
  with open(os.path.join(workdir, "checkpoints", str(steps[-1]), "meta", "metadata")) as f:
    state = json.load(f)["state_fingerprint"]
  text = json.dumps({"metrics": rows, "state": state}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


def run(full: bool = False) -> dict[str, str]:
  """name -> digest of each variant, run in order in one temporary directory."""
  from grpo_jax.train import loop
  with tempfile.TemporaryDirectory() as tmp:
    out = {}
    for name, config in variants(tmp, full).items():
      loop.train(config(), os.path.join(tmp, name))
      out[name] = digest(os.path.join(tmp, name))
    return out


def main(argv):
  kind = "full" if "--full" in argv else "test"
  got = run(kind == "full")
  print(json.dumps({cpu_signature(): {kind: got}}, indent=2))
  if "--out" in argv:
    with open(argv[argv.index("--out") + 1], "w") as f:
      json.dump({cpu_signature(): {kind: got}}, f)
  if "--record" in argv:
    records = {}
    if os.path.exists(RECORD):
      with open(RECORD) as f:
        records = json.load(f)
    records.setdefault(cpu_signature(), {})[kind] = got
    with open(RECORD, "w") as f:
      json.dump(records, f, indent=2, sort_keys=True)
      f.write("\n")


if __name__ == "__main__":
  main(sys.argv[1:])
