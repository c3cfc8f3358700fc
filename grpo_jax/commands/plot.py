"""`grpo-plot`: plots reward, held-out accuracy, KL, entropy and completion length of one or more runs on one
figure.

  grpo-plot runs/default                       # -> runs/default/curves.png
  grpo-plot runs/a runs/b --out compare.png    # several runs, one line each
"""
from grpo_jax.commands import command_parser, exit_on_mistake
from grpo_jax.persist.layout import RunFiles
from grpo_jax.train.plotting import plot_runs


def main(argv=None) -> None:
  """The `grpo-plot` command."""
  exit_on_mistake("grpo-plot", lambda: run(argv))


def run(argv=None) -> None:
  parser = command_parser("grpo-plot", __doc__)
  parser.add_argument("workdirs", nargs="+", help="training workdirs (each holds a metrics.jsonl)")
  parser.add_argument("--out", default=None, help="PNG path (default: WORKDIR/curves.png for one run, "
                      "curves.png in the current directory for several)")
  parser.add_argument("--labels", nargs="*", default=None, help="legend labels, one per workdir")
  parser.add_argument("--metrics", default="", help="comma-separated metric names, one panel each (default: "
                      "reward, held-out accuracy, KL, entropy, completion length, and messages per episode "
                      "when logged)")
  args = parser.parse_args(argv)
  out = args.out or (RunFiles(args.workdirs[0]).curves if len(args.workdirs) == 1 else "curves.png")
  if args.labels and len(args.labels) != len(args.workdirs):
    parser.error(f"--labels has {len(args.labels)} entries for {len(args.workdirs)} workdirs")
  metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] or None
  print(plot_runs(args.workdirs, out, args.labels, metrics))


if __name__ == "__main__":
  main()
