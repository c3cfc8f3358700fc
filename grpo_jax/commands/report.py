"""`grpo-report`: summarizes a sweep directory: per-group table (Markdown + CSV) with 95% intervals over seeds,
paired tests against a baseline, per-member CSV, curves with interval bands (PNG); --plan sizes the next study.

  grpo-report runs/ablation_variants                      # -> runs/ablation_variants/report/
  grpo-report runs/av --group_by '^(.*)_seed\\d+$' --out docs/ablations --smooth 10
  grpo-report runs/av --groups '^(grpo_smtm|dapo|gspo)' --out runs/av/report_headline
  grpo-report runs/pilot --baseline grpo --plan --effect 0.05 --width 0.1   # plan the next study from a pilot
  grpo-report runs/pilot --baseline grpo --mean_of entropy --plan --metric mean:entropy

Groups default to each member's `group` from the sweep file (its name without `_seed<N>`); --group_by REGEX
regroups by the regex's named group `group`, else its group 1, else the whole match in the member name.
The definitions of every number are in grpo_jax/sweep/results.py and tables.py.
"""
from __future__ import annotations

import sys

from grpo_jax import storage
from grpo_jax.commands import command_parser, exit_on_mistake
from grpo_jax.sweep import report, results, tables


def run(argv=None) -> int:
  """Writes the report as the command line `argv` says; prints its summary."""
  parser = command_parser("grpo-report", __doc__)
  parser.add_argument("sweep_dir")
  parser.add_argument("--group_by", default=None, help="regex on member names that yields the group")
  parser.add_argument("--out", default=None, help="output directory (default SWEEP_DIR/report)")
  parser.add_argument("--smooth", type=int, default=10, help="moving-average window for reward and KL curves")
  parser.add_argument("--title", default=None)
  parser.add_argument("--groups", default=None, help="regex (re.search) on group names: report only those")
  parser.add_argument("--baseline", default=None, help="a group to compare the others with, paired by seed")
  parser.add_argument("--primary", default="", help="comma-separated paired columns whose comparisons with "
                      "--baseline form Holm's family (default: the first, eval_acc_final); the rest are exploratory")
  parser.add_argument("--mean_of", default="", help="comma-separated metric names: add a column with the mean "
                      "over steps of each (e.g. clip_ratio/region,entropy)")
  parser.add_argument("--curves", default="", help="comma-separated metric names: metrics.png draws each "
                      "per group, the mean over seeds with its 95%% t interval (e.g. entropy,completions/mean_length)")
  parser.add_argument("--wall_clock", action="store_true", help="wall_clock.png: held-out accuracy per group "
                      "(mean over seeds, 95%% t interval) against the seconds its steps and evaluations took")
  parser.add_argument("--plan", action="store_true", help="print what this pilot says about the next study "
                      "(smallest detectable effect for 3, 5, 10, 20 seeds; seeds for --effect; prompts for --width) "
                      "instead of writing the report")
  parser.add_argument("--metric", default="eval_acc_final", help="--plan's per-member figure: a column of the "
                      "report (eval_acc_final, reward_auc, ...) or mean:<metric> of --mean_of")
  parser.add_argument("--effect", type=float, default=None, help="--plan: the effect the next study must detect")
  parser.add_argument("--width", type=float, default=None,
                      help="--plan: the width of the 95%% interval on held-out accuracy the next study wants")
  args = parser.parse_args(argv)
  if args.smooth < 1:
    parser.error(f"--smooth {args.smooth}: the moving-average window must be >= 1 (1: no smoothing)")
  group_fn = results.regex_grouper(args.group_by) if args.group_by else None
  extra = [k for k in args.mean_of.split(",") if k]
  if args.plan:
    runs = results.select_groups(results.load_sweep_dir(args.sweep_dir, group_fn, extra), args.groups)
    known = [c for c, _, _ in tables.columns_of(runs)]
    if args.metric not in known:
      parser.error(f"--metric {args.metric!r}: not a column of this report; columns: {', '.join(known)} "
                   "(mean:<metric> needs --mean_of <metric>)")
    print(tables.plan_markdown(tables.plan(runs, args.metric, args.baseline, args.effect, args.width)))
    return 0
  paths = report.write_report(args.sweep_dir, args.out, group_fn, args.smooth, args.title, args.groups,
                              args.baseline, extra, [k for k in args.curves.split(",") if k],
                              [k for k in args.primary.split(",") if k], args.wall_clock)
  print(storage.read_text(paths["summary.md"]))
  print("wrote " + ", ".join(paths.values()))
  return 0


def main() -> None:
  """The `grpo-report` command."""
  sys.exit(exit_on_mistake("grpo-report", run))


if __name__ == "__main__":
  main()
