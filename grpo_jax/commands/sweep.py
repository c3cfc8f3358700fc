"""`grpo-sweep`: expands an experiment file's get_sweep() and runs its members: one after another on this
machine (default), as Ray tasks on a cluster (--backend=ray), or prints their commands.

  grpo-sweep --config experiments/ablation_variants.py --sweep_dir runs/ablation_variants
  grpo-sweep --config experiments/ablation_variants.py --sweep_dir /mnt/shared/av --backend=ray \
      --ray_address=auto --member_resources='{"GPU": 1}'
  grpo-sweep --config experiments/ablation_variants.py --sweep_dir runs/av --print_commands
  grpo-sweep ... --only 'grpo_.*_seed0' --set num_steps=50 --set eval.every=10

`python -m grpo_jax.commands.sweep` and `python scripts/sweep.py` (what a Ray job's working directory runs) are
the same command.

Each member trains into SWEEP_DIR/<name> (log: train.log). A member is finished once its workdir has DONE
(written after the trainer exits with code 0); started again, the sweep skips finished members and re-runs the
others, which resume from their latest checkpoint. Failures write FAILED (exit code + log tail) and do not stop
the sweep; the exit code is 1 if any member failed in this invocation. A member whose trainer crashes or is
killed is retried up to --max_attempts times in all (resuming from its checkpoint); one that fails with a user
error (exit code 2: a bad key or value) fails once. A preempted attempt (the trainer's exit code 75 after SIGTERM,
or on Ray a lost node or worker) is retried without counting against --max_attempts, up to --max_preemptions
times per member; attempts.jsonl and the summary show preemptions apart from failures.
--backend=ray (the `ray` extra) runs the members as Ray tasks: --ray_address picks the cluster (absent: a local
Ray instance), --member_resources what one member needs per host ({"GPU": 1}, {"TPU": 4, "hosts": 2}, ...; else
the experiment file's get_member_resources(), else one GPU / a TPU host / a whole CPU node, whichever the
cluster has or its autoscaler can start; where that cannot be told, it asks for --member_resources).
SWEEP_DIR must be storage every node mounts at the same path (docs/clusters.md).
--print_commands prints one line per member for a job array: by default a `grpo_jax.commands.sweep --only '^NAME$'`
line (same markers, logs and skipping), with --print_format=train the bare trainer command (which knows nothing
of markers or of `init_from`: each such member then repeats its own warm start). In a job array, a member with
`init_from` that starts before its donor has written its warm start (warmstart/) also runs its own warm start.
"""
from __future__ import annotations

import argparse
import ast
import re
import shlex
import signal
import sys

from grpo_jax import hash_seed, signals
from grpo_jax.commands import command_parser, exit_on_mistake
from grpo_jax.errors import UserError
from grpo_jax.sweep import load_members, run_sweep, runner, spec


def _parse_set(text: str):
  if "=" not in text:
    raise argparse.ArgumentTypeError(f"--set {text!r}: expected KEY=VALUE, e.g. num_steps=50")
  key, value = text.split("=", 1)
  try:
    parsed = ast.literal_eval(value)
  except (ValueError, SyntaxError):
    parsed = value
  if value in ("true", "false"):
    parsed = value == "true"
  return key, parsed


def _interrupt(signum, frame):
  raise KeyboardInterrupt(f"signal {signum}")


def run(argv=None) -> int:
  """Runs (or prints, or lists) the members; the exit code: 1 if a member failed in this invocation."""
  parser = command_parser("grpo-sweep", __doc__)
  parser.add_argument("--config", required=True, help="experiment file defining get_sweep() (path.py[:preset])")
  parser.add_argument("--sweep_dir", required=True, help="one workdir per member is created under it")
  parser.add_argument("--only", default=None, help="regex (re.search) on member names: run/print only those")
  parser.add_argument("--set", dest="common", action="append", type=_parse_set, default=[],
                      metavar="KEY=VALUE", help="override applied to every member (repeatable)")
  parser.add_argument("--print_commands", action="store_true", help="print one launch command per member")
  parser.add_argument("--print_format", choices=("sweep", "train"), default="sweep",
                      help="sweep: a grpo-sweep line per member (keeps markers); train: the bare trainer")
  parser.add_argument("--status", action="store_true", help="list each member's status and exit")
  parser.add_argument("--skip_failed", action="store_true", help="do not re-run members marked FAILED")
  parser.add_argument("--no_check_keys", action="store_true",
                      help="do not check override keys against the experiment's get_config() first")
  parser.add_argument("--train_cmd", default=None,
                      help="trainer command line to which --config/--workdir/--config.k=v are appended "
                           "(default: this Python + -m grpo_jax.commands.train)")
  parser.add_argument("--backend", choices=("local", "ray"), default="local",
                      help="local: members one after another on this machine; ray: Ray tasks on a cluster")
  parser.add_argument("--ray_address", default=None,
                      help="Ray cluster: 'auto', 'ray://host:10001', ... (absent: start a local Ray instance)")
  parser.add_argument("--member_resources", default=None,
                      help='JSON: what one member needs per host, e.g. \'{"GPU": 1}\' or \'{"TPU": 4, "hosts": 2}\'')
  parser.add_argument("--max_attempts", type=int, default=3,
                      help="attempts per member while it fails for a reason other than a user error")
  parser.add_argument("--max_preemptions", type=int, default=runner.MAX_PREEMPTIONS,
                      help="preempted attempts (exit code 75, a lost Ray node) retried per member, apart from "
                           "--max_attempts; past it the member is marked FAILED")
  args = parser.parse_args(argv)
  if args.max_attempts < 1:
    parser.error(f"--max_attempts must be >= 1, got {args.max_attempts}")
  if args.max_preemptions < 0:
    parser.error(f"--max_preemptions must be >= 0, got {args.max_preemptions}")

  common = dict(args.common)
  members = load_members(args.config, only=args.only, common=common, check_keys=not args.no_check_keys)
  if args.status:
    for m in members:
      print(f"{runner.status(runner.member_dir(args.sweep_dir, m)):<11} {m.name}")
    return 0
  if args.print_commands:
    train_cmd = shlex.split(args.train_cmd) if args.train_cmd else spec.default_train_cmd()
    for m in members:
      if args.print_format == "train":
        line = spec.train_command(train_cmd, args.config, runner.member_dir(args.sweep_dir, m),
                                  spec.merge_overrides(common, m))
      else:
        line = [sys.executable, "-m", "grpo_jax.commands.sweep", "--config", args.config,
                "--sweep_dir", args.sweep_dir, "--only", f"^{re.escape(m.name)}$"]
        line += [f"--set={k}={spec.format_value(v)}" for k, v in common.items()]
        if args.train_cmd:
          line += ["--train_cmd", args.train_cmd]
      print(shlex.join(line))
    return 0
  # SIGTERM (e.g. a cluster's time limit) unwinds like Ctrl-C: the trainer is stopped, the member stays unfinished.
  signals.install(_interrupt, (signal.SIGTERM,))
  outcomes = run_sweep(args.config, args.sweep_dir, backend=args.backend, members=members, only=args.only,
                       common=common, train_cmd=shlex.split(args.train_cmd) if args.train_cmd else None,
                       skip_failed=args.skip_failed, max_attempts=args.max_attempts,
                       max_preemptions=args.max_preemptions,
                       member_resources=args.member_resources, ray_address=args.ray_address)
  counts = {k: list(outcomes.values()).count(k) for k in sorted(set(outcomes.values()))}
  print(f"[sweep] {len(members)} members: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
  return 1 if "failed" in outcomes.values() else 0


def main() -> None:
  """The `grpo-sweep` command."""
  # The members' trainers inherit the hash seed, so none of them re-executes to set it (grpo_jax/hash_seed.py).
  hash_seed.pin()
  try:  # a bad sweep file, flag or key, a missing extra, an unshared sweep directory: one line naming it
    sys.exit(exit_on_mistake("grpo-sweep", run, (UserError, ValueError, KeyError, TypeError, FileNotFoundError,
                                                 AttributeError)))
  except KeyboardInterrupt as e:
    # Ctrl-C or SIGTERM (a cluster's time limit): the running member's trainer was stopped, its checkpoints kept.
    print(f"[sweep] interrupted ({e or 'Ctrl-C'}): the running member stopped at its last checkpoint; run the same "
          "command again to resume", file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  main()
