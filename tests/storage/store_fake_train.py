"""A stand-in for scripts/train.py whose workdir is on a store (through grpo_jax.storage): writes metrics.jsonl
and, at the end, summary.json. `--config.crash_at=K`: the first attempt prints a traceback and exits 1 before
step K, a later one resumes at K (its "checkpoint" is the object `ckpt`). A fresh run "warm starts": it commits
warmstart/0 as orbax does on a store (its commit_success.txt); with --config.warmstart.init_checkpoint=DONOR it
says it starts from DONOR's instead."""
import json
import sys

from grpo_jax import storage


def main(argv):
  args = {"num_steps": "3", "crash_at": "-1", "warmstart.init_checkpoint": ""}
  workdir = argv[argv.index("--workdir") + 1]
  for a in argv:
    if a.startswith("--config."):
      key, value = a[len("--config."):].split("=", 1)
      args[key] = value
  ckpt = storage.join(workdir, "ckpt")
  start = int(storage.read_text(ckpt)) if storage.exists(ckpt) else 0
  metrics = storage.join(workdir, "metrics.jsonl")
  rows = storage.read_text(metrics) if storage.exists(metrics) else ""
  print(f"store_fake_train starting at step {start} in {workdir}", flush=True)
  if start == 0 and args["warmstart.init_checkpoint"]:
    print(f"starting from {args['warmstart.init_checkpoint']}'s warm start", flush=True)
  elif start == 0:
    storage.write_text(storage.join(workdir, "warmstart", "0", "commit_success.txt"), "committed")
  for step in range(start, int(args["num_steps"]) + 1):
    if step == int(args["crash_at"]) and start < step:
      storage.write_text(ckpt, str(step))
      print("Traceback (most recent call last):\nRuntimeError: simulated crash", file=sys.stderr)
      return 1
    rows += json.dumps({"step": step, "reward": step / 10}) + "\n"
    storage.write_text(metrics, rows)
  storage.write_text(storage.join(workdir, "summary.json"), json.dumps({"wall_s": 1.0}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
