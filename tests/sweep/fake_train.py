"""A stand-in for scripts/train.py in the sweep tests: same command line, writes metrics.jsonl, can fail or crash.

Understood overrides: --config.num_steps=N (default 4), --config.seed=S, --config.fail=true (exit 3 at once with
a ValueError on stderr), --config.crash_at=K (the first attempt logs steps < K, "checkpoints" K and exits 1; a
later attempt resumes from the checkpoint). Every invocation is appended to WORKDIR/invocations.jsonl.
"""
import json
import os
import sys


def main(argv):
  args = {"num_steps": "4", "seed": "0", "fail": "false", "crash_at": "-1"}
  workdir = config = None
  i = 0
  while i < len(argv):
    if argv[i] == "--workdir":
      workdir, i = argv[i + 1], i + 2
    elif argv[i] == "--config":
      config, i = argv[i + 1], i + 2
    elif argv[i].startswith("--config."):
      key, value = argv[i][len("--config."):].split("=", 1)
      args[key], i = value, i + 1
    else:
      raise SystemExit(f"fake_train: unexpected argument {argv[i]!r}")
  assert workdir and config, argv
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "invocations.jsonl"), "a") as f:
    f.write(json.dumps(argv) + "\n")
  print(f"fake_train starting in {workdir}")
  if args["fail"] == "true":
    print("Traceback (most recent call last):\nValueError: fake failure for the test", file=sys.stderr)
    return 3
  ckpt = os.path.join(workdir, "ckpt")
  start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
  num_steps, seed, crash_at = int(args["num_steps"]), int(args["seed"]), int(args["crash_at"])
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    for step in range(start, num_steps):
      if step == crash_at and start == 0:
        open(ckpt, "w").write(str(step))
        print("RuntimeError: simulated crash", file=sys.stderr)
        return 1
      row = {"step": step, "reward": 0.1 * step + 0.01 * seed, "kl": 0.001 * step, "step_time": 0.5,
             "completions/mean_length": 3.0}
      if step == 0 or step == num_steps - 1:
        row["eval/accuracy"] = 0.2 + 0.1 * step
      f.write(json.dumps(row) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
