"""A stand-in for scripts/train.py in the sweep tests: same command line, writes metrics.jsonl, can fail or crash.

Like the real trainer, a fresh run first "warm starts": it writes the step-0 checkpoint (checkpoints/0 with an
orbax-like commit_success.txt and the seed), warmstart/0, warmstart.jsonl and the step-0 evaluation row; with
--config.warmstart.init_checkpoint=DONOR it instead copies the donor's step-0 row and warmstart.jsonl (a warm
start shared by the sweep runner). A workdir that already has checkpoints/0 skips both (a resume; the seed
must match).
Then steps 1..num_steps are logged, with an evaluation at the last one.
Understood overrides: --config.num_steps=N (default 4), --config.seed=S, --config.fail=true (exit 3 at once with
a ValueError on stderr), --config.config_error=true (exit 2 at once: a user error), --config.sleep=S (seconds per
step), --config.crash_at=K (the first attempt stops before step K, "checkpoints" K and exits 1; a later attempt
resumes there), --config.preempt_at=K (the same once, but exit 75 as the trainer does after SIGTERM:
EXIT_PREEMPTED), --config.always_preempted=true (exit 75 at once, every time), --config.handles_sigterm=true
(SIGTERM makes it exit 75, as scripts/train.py does after saving its last step). Every invocation is appended to
WORKDIR/invocations.jsonl with its CUDA_VISIBLE_DEVICES, start and end times (invocations_env.jsonl), and how it
started ("warm start", "from checkpoint 0" or "from DONOR") to WORKDIR/starts.txt.
"""
import json
import os
import signal
import sys
import time


def main(argv):
  args = {"num_steps": "4", "seed": "0", "fail": "false", "crash_at": "-1", "warmstart.init_checkpoint": "",
          "config_error": "false", "sleep": "0", "preempt_at": "-1", "always_preempted": "false",
          "handles_sigterm": "false"}
  started = time.time()
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
  if args["config_error"] == "true":
    print("grpo-train: error: config.fake: a user error for the test", file=sys.stderr)
    return 2
  if args["handles_sigterm"] == "true":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
  if args["always_preempted"] == "true":
    print("[preempted] SIGTERM: stopped at the last completed step", file=sys.stderr)
    return 75
  if args["fail"] == "true":
    print("Traceback (most recent call last):\nValueError: fake failure for the test", file=sys.stderr)
    return 3
  num_steps, seed, crash_at = int(args["num_steps"]), int(args["seed"]), int(args["crash_at"])
  preempt_at = int(args["preempt_at"])
  ckpt0 = os.path.join(workdir, "checkpoints", "0")
  metrics = open(os.path.join(workdir, "metrics.jsonl"), "a")
  resume = os.path.join(workdir, "ckpt")
  start = int(open(resume).read()) if os.path.exists(resume) else 1
  if os.path.isdir(ckpt0):
    if int(open(os.path.join(ckpt0, "seed")).read()) != seed:
      print("ValueError: workdir holds a run with another seed", file=sys.stderr)
      return 2
    how = "from checkpoint 0"
  elif args["warmstart.init_checkpoint"]:
    donor = args["warmstart.init_checkpoint"]
    if not os.path.exists(os.path.join(donor, "warmstart", "0", "commit_success.txt")):
      print(f"FileNotFoundError: {donor} holds no starting point", file=sys.stderr)
      return 2
    os.makedirs(ckpt0)
    open(os.path.join(ckpt0, "seed"), "w").write(str(seed))
    with open(os.path.join(donor, "metrics.jsonl")) as f:
      metrics.write(next(line for line in f if json.loads(line)["step"] == 0))
    with open(os.path.join(donor, "warmstart.jsonl")) as a, open(os.path.join(workdir, "warmstart.jsonl"), "w") as b:
      b.write(a.read())
    how = f"from {donor}"
  else:
    os.makedirs(ckpt0)
    open(os.path.join(ckpt0, "seed"), "w").write(str(seed))
    open(os.path.join(ckpt0, "commit_success.txt"), "w").write("ok")
    os.makedirs(os.path.join(workdir, "warmstart", "0"))
    open(os.path.join(workdir, "warmstart", "0", "commit_success.txt"), "w").write("ok")
    open(os.path.join(workdir, "warmstart.jsonl"), "w").write(json.dumps({"step": 9, "seed": seed}) + "\n")
    metrics.write(json.dumps({"step": 0, "eval/accuracy": 0.2 + 0.01 * seed}) + "\n")
    how = "warm start"
  with open(os.path.join(workdir, "starts.txt"), "a") as f:
    f.write(how + "\n")
  with metrics:
    for step in range(start, num_steps + 1):
      if step == crash_at and not os.path.exists(resume):
        open(resume, "w").write(str(step))
        print("RuntimeError: simulated crash", file=sys.stderr)
        return 1
      if step == preempt_at and not os.path.exists(os.path.join(workdir, "preempted")):
        open(resume, "w").write(str(step))
        open(os.path.join(workdir, "preempted"), "w").write(str(step))
        print("[preempted] SIGTERM: stopped at the last completed step", file=sys.stderr)
        return 75
      row = {"step": step, "reward": 0.1 * step + 0.01 * seed, "kl": 0.001 * step, "step_time": 0.5,
             "completions/mean_length": 3.0}
      if step == num_steps:
        row["eval/accuracy"] = 0.2 + 0.1 * step
      metrics.write(json.dumps(row) + "\n")
      metrics.flush()
      time.sleep(float(args["sleep"]))
  with open(os.path.join(workdir, "invocations_env.jsonl"), "a") as f:
    f.write(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": started,
                        "end": time.time(), "file": os.path.abspath(__file__)}) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
