"""Turns a sweep directory into a comparison: per-group tables (Markdown, CSV) and curves with seed bands (PNG).

Per member, from its `metrics.jsonl` (rows merged by `step`: a later row for a step updates an earlier one, so
an evaluation row and a step re-logged after a resume both land on their step):
  eval_acc_start  `eval/accuracy` at the first step that has it (step 0: the warm-started policy),
  eval_acc_final  `eval/accuracy` at the last step that has it (the final held-out accuracy),
  constant_answer `eval/constant_answer` (reasoning-gym tasks, step 0): what one constant answer scores on the
                  held-out set, the floor a task's accuracy is read against (grpo_jax/data/reasoning_gym.py),
  full_credit_final `eval/full_credit` at the last step that has it (the share of items with full credit),
  reward_auc      mean of `reward` over all steps that have it (area under the reward curve / number of steps),
  kl_final        `kl` at the last step that has it (absent when the run does not compute a KL, e.g. β = 0),
  mean_length     mean of `completions/mean_length` over steps,
  steps_per_s     1 / median(`step_time`): the median ignores the compile steps at the start and after a resume,
  wall_s          seconds the sweep runner measured over all attempts (DONE / FAILED / attempts.jsonl) or the
                  trainer's `wall_s` in summary.json, whichever is larger (runner.member_wall_s: an attempt
                  killed without a trace records no end); without either, the sum of `step_time`,
  steps           the last step logged,
  mean:<metric>   for metrics asked for with --mean_of: the mean over the steps that logged it.
Per group: the mean over the group's finished members ('done') with its 95% Student's t interval over seeds,
the sample standard deviation (ddof=1) and n (groups.csv has them all).

Sweeps over tasks ("variant × task" studies, e.g. experiments/gym.py's get_sweep): when the members' `task.name`
or `task.options` overrides take more than one value, the report adds one table per TASK_COLUMNS metric with a
row per variant and a column per task (`task_table`, tasks.csv). A variant is the set of a group's shared
overrides other than `task.*`; its label is what its groups' names have in common (the task part removed).
"""
from __future__ import annotations

import contextlib
import csv
import io
import math
import re
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from grpo_jax import storage
from grpo_jax.stats import comparisons, intervals, power
from grpo_jax.sweep import runner
from grpo_jax.sweep import spec as spec_lib
from grpo_jax.data.reasoning_gym import CONSTANT_ANSWER_METRIC
from grpo_jax.train.layout import RunFiles
from grpo_jax.train.metrics import read_jsonl
from grpo_jax.train.plotting import draw_panels

REWARD, EVAL_ACC, KL, LENGTH, STEP_TIME = "reward", "eval/accuracy", "kl", "completions/mean_length", "step_time"
FULL_CREDIT = "eval/full_credit"

# (column, header, format) of the per-group table, in order.
COLUMNS = [
    ("eval_acc_start", "eval acc @0", "{:.3f}"),
    ("eval_acc_final", "final eval acc", "{:.3f}"),
    ("reward_auc", "reward AUC", "{:.3f}"),
    ("kl_final", "final KL", "{:.2e}"),
    ("mean_length", "mean length", "{:.2f}"),
    ("steps_per_s", "steps/s", "{:.2f}"),
    ("wall_s", "wall (s)", "{:.0f}"),
]
CURVES = [(REWARD, "reward (train)"), (EVAL_ACC, "held-out accuracy"), (KL, "KL to reference")]


def read_metrics(path: str) -> dict[int, dict[str, Any]]:
  """step -> merged metrics. Unparseable lines (e.g. a line cut short by a kill) are skipped."""
  rows: dict[int, dict[str, Any]] = {}
  for row in read_jsonl(path):
    with contextlib.suppress(ValueError, KeyError, TypeError):
      rows.setdefault(int(row["step"]), {}).update(row)
  return rows


def series(rows: Mapping[int, Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the steps where `key` is a finite number, in step order."""
  steps, values = [], []
  for step in sorted(rows):
    value = rows[step].get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
      steps.append(step)
      values.append(float(value))
  return np.asarray(steps, np.int64), np.asarray(values, np.float64)


def summarize(rows: Mapping[int, Mapping[str, Any]], wall_s: float | None = None,
              extra: Sequence[str] = ()) -> dict[str, float]:
  """The per-member numbers of the module docstring; NaN where the metric was never logged. For each metric
  name in `extra`, `mean:<name>` is its mean over the steps that logged it."""
  nan = float("nan")

  def of(key: str, pick: Callable[[np.ndarray], float]) -> float:
    """pick(the logged values of `key`, in step order); NaN when it was never logged."""
    _, values = series(rows, key)
    return pick(values) if values.size else nan

  first, last, mean = (lambda v: v[0]), (lambda v: v[-1]), (lambda v: v.mean())
  _, step_time = series(rows, STEP_TIME)
  if wall_s is None:
    wall_s = float(step_time.sum()) if step_time.size else nan
  return {
      "eval_acc_start": of(EVAL_ACC, first),
      "eval_acc_final": of(EVAL_ACC, last),
      "constant_answer": of(CONSTANT_ANSWER_METRIC, first),
      "full_credit_final": of(FULL_CREDIT, last),
      "reward_auc": of(REWARD, mean),
      "kl_final": of(KL, last),
      "mean_length": of(LENGTH, mean),
      "steps_per_s": 1.0 / np.median(step_time) if step_time.size and np.median(step_time) > 0 else nan,
      "wall_s": wall_s,
      "steps": float(max(rows)) if rows else nan,
      **{f"mean:{key}": of(key, mean) for key in extra},
  }


class MemberRun:
  """One member's workdir: identity, status, metrics and (if it failed) its error."""

  def __init__(self, name: str, group: str, workdir: str, overrides: Mapping[str, Any] | None = None,
               extra: Sequence[str] = ()):
    self.name, self.group, self.workdir, self.extra = name, group, workdir, tuple(extra)
    self.overrides = dict(overrides or {})
    self.status = runner.status(workdir)
    self.files = RunFiles(workdir)
    self.rows = read_metrics(self.files.metrics)
    marker = runner.read_json(storage.join(workdir, runner.DONE if self.status == "done" else runner.FAILED))
    # A marker written before runner.member_wall_s existed may have missed an attempt killed without a trace.
    walls = [w for w in ((marker or {}).get("wall_s"), runner.member_wall_s(workdir)) if w]
    wall_s = max(walls) if walls else None
    self.error = (marker or {}).get("error", "") if self.status == "failed" else ""
    self.summary = summarize(self.rows, wall_s, self.extra)
    self._eval_rows = None

  @property
  def final_eval(self) -> tuple[tuple[str, ...], np.ndarray] | None:
    """(prompts, greedy accuracy reward per prompt) of the member's last held-out evaluation's rows
    (WORKDIR/eval/step_<N>.jsonl, written by runs since eval rows existed), or None."""
    if self._eval_rows is None:
      steps = self.files.eval_row_steps()
      rows = read_jsonl(self.files.eval_rows(steps[-1])) if steps else []
      self._eval_rows = ((tuple(r["prompt"] for r in rows), np.asarray([r["greedy"]["reward"] for r in rows],
                                                                        np.float64)) if rows else False)
    return self._eval_rows or None


def load_sweep_dir(sweep_dir: str, group_fn: Callable[[str, str], str] | None = None,
                   extra: Sequence[str] = ()) -> list[MemberRun]:
  """Members of a sweep directory: those planned in sweep.json (in its order), then any other subdirectory that
  has a member.json or metrics.jsonl. `group_fn(name, planned_group) -> group` regroups them; `extra` metric
  names get a column with their mean over steps."""
  if not storage.isdir(sweep_dir):
    raise FileNotFoundError(f"sweep directory {sweep_dir!r} does not exist")
  planned = (runner.read_json(storage.join(sweep_dir, runner.SWEEP_JSON)) or {}).get("members", [])
  entries = [(m["name"], m.get("group"), m.get("overrides")) for m in planned]
  known = {name for name, _, _ in entries}
  for name in sorted(storage.listdir(sweep_dir)):
    workdir = storage.join(sweep_dir, name)
    if name in known or not storage.isdir(workdir):
      continue
    info = runner.read_json(storage.join(workdir, runner.MEMBER_JSON))
    if info is None and not storage.exists(RunFiles(workdir).metrics):
      continue
    entries.append((name, (info or {}).get("group"), (info or {}).get("overrides")))
  if not entries:
    raise ValueError(f"{sweep_dir!r} holds no sweep members (no sweep.json, no member workdirs)")
  runs = []
  for name, group, overrides in entries:
    group = group or spec_lib.default_group(name)
    if group_fn is not None:
      group = group_fn(name, group)
    runs.append(MemberRun(name, group, storage.join(sweep_dir, name), overrides, extra))
  return runs


def regex_grouper(pattern: str) -> Callable[[str, str], str]:
  """Group = the named group `group`, else group 1, else the whole match of `pattern` in the member name."""
  try:
    compiled = re.compile(pattern)
  except re.error as e:
    raise ValueError(f"--group_by {pattern!r} is not a regular expression: {e}") from None

  def group_fn(name: str, planned_group: str) -> str:
    match = compiled.search(name)
    if match is None:
      raise ValueError(f"--group_by {pattern!r} does not match member {name!r}")
    if "group" in compiled.groupindex:
      return match.group("group")
    return match.group(1) if compiled.groups else match.group(0)

  return group_fn


def select_groups(runs: Sequence[MemberRun], pattern: str | None) -> list[MemberRun]:
  """The members whose group matches `pattern` (re.search); all when it is None."""
  if pattern is None:
    return list(runs)
  chosen = [r for r in runs if re.search(pattern, r.group)]
  if not chosen:
    raise ValueError(f"--groups {pattern!r} matches none of the groups {sorted({r.group for r in runs})}")
  return chosen


def groups_in_order(runs: Sequence[MemberRun]) -> dict[str, list[MemberRun]]:
  grouped: dict[str, list[MemberRun]] = {}
  for run in runs:
    grouped.setdefault(run.group, []).append(run)
  return grouped


class SeedStat(NamedTuple):
  """A group's figure over its finished seeds: mean, sample std (ddof=1), count, and the mean's 95% t interval
  (grpo_jax/stats/intervals.py: a bootstrap over a handful of seeds under-covers)."""
  mean: float
  std: float
  n: int
  lo: float = math.nan
  hi: float = math.nan


def mean_std(values: Iterable[float]) -> SeedStat:
  """The SeedStat of the finite values (std and interval NaN for one value)."""
  x = np.asarray([v for v in values if math.isfinite(v)], np.float64)
  if x.size == 0:
    return SeedStat(math.nan, math.nan, 0)
  ci = intervals.over_seeds(x)
  return SeedStat(float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan, int(x.size), ci.lo, ci.hi)


def columns_of(runs: Sequence[MemberRun]):
  """COLUMNS plus a `mean:<metric>` column per extra metric the runs were loaded with."""
  extra = runs[0].extra if runs else ()
  return COLUMNS + [(f"mean:{key}", f"mean {key}", "{:.3g}") for key in extra]


def group_table(runs: Sequence[MemberRun]) -> list[dict[str, Any]]:
  """One dict per group: counts by status and (mean, std, n) of every column over its finished members."""
  table = []
  for group, members in groups_in_order(runs).items():
    done = [m for m in members if m.status == "done"]
    row: dict[str, Any] = {"group": group, "members": len(members), "done": len(done),
                           "failed": sum(m.status == "failed" for m in members)}
    for column, _, _ in columns_of(runs):
      row[column] = mean_std(m.summary[column] for m in done)
    table.append(row)
  return table


PAIRED_COLUMNS = [("eval_acc_final", "Δ final eval acc", "{:+.3f}"), ("reward_auc", "Δ reward AUC", "{:+.3f}")]


def paired_columns(runs: Sequence[MemberRun]):
  """PAIRED_COLUMNS plus a Δ column per `--mean_of` metric the runs were loaded with."""
  extra = runs[0].extra if runs else ()
  return PAIRED_COLUMNS + [(f"mean:{key}", f"Δ mean {key}", "{:+.3g}") for key in extra]


def same_seed_pairs(members: Sequence[MemberRun], baseline: Sequence[MemberRun]) -> list[tuple[MemberRun, MemberRun]]:
  """(member, the baseline member with the same seed, the `_seed<N>` suffix) for the finished members of both."""
  base = {spec_lib.seed_of(b.name): b for b in baseline if b.status == "done" and spec_lib.seed_of(b.name) is not None}
  return [(m, base[spec_lib.seed_of(m.name)]) for m in members
          if m.status == "done" and spec_lib.seed_of(m.name) in base]


def paired_table(runs: Sequence[MemberRun], baseline: str,
                 primary: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Per group: differences to the `baseline` group's member with the same seed (`_seed<N>` suffix), over the
  finished pairs: a `comparisons.Paired` (mean, t interval, p, n, wins) per column, `<column>_wins`, the
  Holm-adjusted p over the primary comparisons (every group's cells in the `primary` columns, default the first
  column) as `<column>_holm` (NaN in the other, exploratory, columns), and the probability of
  improvement over the same-seed pairs as `<column>_poi` (estimate, interval).

  Members with the same seed share the warm start and the data order, so a paired difference removes the
  seed-to-seed spread of the starting point that dominates the per-group std."""
  grouped = groups_in_order(runs)
  if baseline not in grouped:
    raise ValueError(f"--baseline {baseline!r} is not a group; groups: {list(grouped)}")
  columns = [column for column, _, _ in paired_columns(runs)]
  primary = primary or columns[:1]
  if set(primary) - set(columns):
    raise ValueError(f"--primary {sorted(set(primary) - set(columns))[0]!r} is not a paired column: {columns}")
  table = []
  for group, members in grouped.items():
    if group == baseline:
      continue
    pairs = same_seed_pairs(members, grouped[baseline])
    row: dict[str, Any] = {"group": group, "pairs": len(pairs)}
    for column in columns:
      differences = [m.summary[column] - b.summary[column] for m, b in pairs]
      row[column], row[column + "_poi"] = comparisons.paired(differences), comparisons.improvement(differences)
      row[column + "_holm"] = math.nan  # exploratory unless primary
      row[column + "_wins"] = row[column].wins
    table.append(row)
  cells = [(row, column) for row in table for column in primary]
  for (row, column), adjusted in zip(cells, comparisons.holm([row[column].p for row, column in cells])):
    row[column + "_holm"] = adjusted
  return table


def _p(p: float) -> str:
  return "–" if not math.isfinite(p) else f"{p:.2g}" if p >= 0.001 else "<0.001"


def _paired_cell(row: dict, column: str, fmt: str) -> str:
  d: comparisons.Paired = row[column]
  if d.n == 0:
    return "–"
  if d.n == 1:
    return f"{fmt.format(d.mean)} (1 seed: no interval; {d.wins}/1)"
  if d.p is None:
    return f"{fmt.format(d.mean)}, no spread: all differences equal ({d.wins}/{d.n})"
  lo, hi = (fmt.format(v) for v in (d.interval.lo, d.interval.hi))
  holm = row[column + "_holm"]
  test = f"Holm {_p(holm)}" if math.isfinite(holm) else "exploratory: unadjusted"
  return f"{fmt.format(d.mean)} [{lo}, {hi}], p {_p(d.p)}, {test} ({d.wins}/{d.n})"


def _poi_cell(row: dict, column: str) -> str:
  estimate, ci = row[column + "_poi"]
  if not math.isfinite(estimate):
    return "–"
  if not math.isfinite(ci.lo):
    return f"{estimate:.2f} (too few seeds for an interval)"
  return f"{estimate:.2f} [{ci.lo:.2f}, {ci.hi:.2f}]"


def paired_markdown(runs: Sequence[MemberRun], baseline: str, primary: Sequence[str] | None = None) -> str:
  table = paired_table(runs, baseline, primary)
  lines = [f"### Paired by seed: difference to `{baseline}`", "",
           "Mean of (group − baseline) over the seeds both finished, with its 95% t interval over seeds, the "
           "two-sided p value of a one-sample t test, and in brackets the seeds where the group is higher. The "
           "primary comparisons (--primary columns, default the first) get Holm's adjustment over all of them; the "
           "other cells are exploratory, their p unadjusted.", "",
           "| group | pairs | " + " | ".join(header for _, header, _ in paired_columns(runs)) + " |",
           "|---|---|" + "---|" * len(paired_columns(runs))]
  for row in table:
    cells = [_paired_cell(row, c, fmt) for c, _, fmt in paired_columns(runs)]
    lines.append(f"| {row['group']} | {row['pairs']} | " + " | ".join(cells) + " |")
  lines += ["", f"Probability of improvement over `{baseline}`: P(a run of the group scores higher than a run of "
            "the baseline), ties counting 1/2: the share of the same-seed pairs where the group is higher, with a "
            "95% percentile bootstrap interval over the pairs.", "",
            "| group | " + " | ".join(header.replace("Δ ", "") for _, header, _ in paired_columns(runs)) + " |",
            "|---|" + "---|" * len(paired_columns(runs))]
  for row in table:
    lines.append(f"| {row['group']} | " + " | ".join(_poi_cell(row, c) for c, _, _ in paired_columns(runs)) + " |")
  return "\n".join(lines) + "\n"


def _shared_prompt_scores(members: Sequence[MemberRun]) -> np.ndarray | None:
  """[S, P] the members' final greedy scores per prompt when all of them evaluated the same prompts, else None."""
  evals = [m.final_eval for m in members]
  if not evals or any(e is None for e in evals) or len({e[0] for e in evals}) != 1:
    return None
  return np.stack([e[1] for e in evals])


def seeds_and_prompts(runs: Sequence[MemberRun], baseline: str | None = None) -> list[dict[str, Any]]:
  """Per group with 2 or more finished members that evaluated the same held-out prompts (and, with a baseline,
  per group's same-seed differences to it): the final greedy accuracy's t interval over seeds and its two-level
  bootstrap (seeds, then prompts), with the standard errors from seeds alone and from prompts alone."""
  out = []
  grouped = {g: [m for m in ms if m.status == "done"] for g, ms in groups_in_order(runs).items()}
  for group, members in grouped.items():
    scores = _shared_prompt_scores(members)
    if scores is not None and len(members) >= 2:
      out.append({"label": group, "n": len(members), "t": intervals.over_seeds(scores.mean(axis=1)),
                  "two_level": comparisons.two_level(scores)})
  if baseline is not None and baseline in grouped:
    for group, members in grouped.items():
      pairs = same_seed_pairs(members, grouped[baseline]) if group != baseline else []
      if len(pairs) < 2:
        continue
      mine, theirs = _shared_prompt_scores([m for m, _ in pairs]), _shared_prompt_scores([b for _, b in pairs])
      if mine is None or theirs is None or pairs[0][0].final_eval[0] != pairs[0][1].final_eval[0]:
        continue
      diffs = mine - theirs
      out.append({"label": f"{group} − {baseline}", "n": len(pairs), "t": intervals.over_seeds(diffs.mean(axis=1)),
                  "two_level": comparisons.two_level(diffs)})
  return out


def seeds_and_prompts_markdown(runs: Sequence[MemberRun], baseline: str | None = None) -> str:
  rows = seeds_and_prompts(runs, baseline)
  if not rows:
    return ""
  lines = ["### Final held-out accuracy: seeds and prompts", "",
           "The members of a group evaluated the same held-out prompts (their rows in WORKDIR/eval/), so an "
           "interval over seeds alone treats those prompts as fixed. The two-level bootstrap resamples seeds, "
           "then prompts (one draw shared by the seeds of a replicate), for an interval that also covers which "
           "prompts were drawn; the standard errors from seeds alone and from prompts alone say which of the two "
           "limits the comparison (more seeds, or more held-out prompts).", "",
           "| group | seeds | mean [95% t interval over seeds] | mean [95% two-level bootstrap] | SE from seeds | "
           "SE from prompts |", "|---|---|---|---|---|---|"]
  for row in rows:
    t, two = row["t"], row["two_level"]
    lines.append(f"| {row['label']} | {row['n']} | {two.mean:+.3f} [{t.lo:+.3f}, {t.hi:+.3f}] | {two.mean:+.3f} "
                 f"[{two.interval.lo:+.3f}, {two.interval.hi:+.3f}] | {two.seed_sd:.3f} | {two.prompt_sd:.3f} |")
  return "\n".join(lines) + "\n"


SEED_COUNTS = (3, 5, 10, 20)


def plan(runs: Sequence[MemberRun], column: str = "eval_acc_final", baseline: str | None = None,
         effect: float | None = None, width: float | None = None) -> dict[str, Any]:
  """What a pilot study says about the next one, for the per-member `column`:
  sd          the spread the test will face: with `baseline`, the pooled std of the same-seed differences to it
              (a paired test); else the pooled within-group std (two independent groups);
  mde[n]      the smallest effect n seeds per group detect at 80% power (two-sided t test, alpha 0.05);
  seeds       the seeds per group that `effect` needs;
  prompts     the held-out prompts a 95% interval of `width` needs, at the pilot's final accuracy (Wilson's for
              0/1 scores, else the normal width with the per-prompt spread of the members' eval rows)."""
  grouped = {g: [m for m in ms if m.status == "done"] for g, ms in groups_in_order(runs).items()}
  if baseline is not None:
    if baseline not in grouped:
      raise ValueError(f"--baseline {baseline!r} is not a group; groups: {list(grouped)}")
    samples = [[m.summary[column] - b.summary[column] for m, b in same_seed_pairs(grouped[g], grouped[baseline])]
               for g in grouped if g != baseline]
  else:
    samples = [[m.summary[column] for m in ms] for ms in grouped.values()]
  samples = [[v for v in x if math.isfinite(v)] for x in samples]
  samples = [x for x in samples if len(x) >= 2]
  dof = sum(len(x) - 1 for x in samples)
  sd = math.sqrt(sum(np.var(x, ddof=1) * (len(x) - 1) for x in samples) / dof) if dof else math.nan
  paired = baseline is not None
  out: dict[str, Any] = {"column": column, "paired": paired, "sd": sd, "dof": dof,
                         "mde": {n: power.min_detectable_effect(sd, n, paired) for n in SEED_COUNTS}}
  if effect is not None:
    out["effect"], out["seeds"] = effect, power.seeds_needed(effect, sd, paired) if math.isfinite(sd) else None
  if width is not None:
    scores = [m.final_eval[1] for ms in grouped.values() for m in ms if m.final_eval is not None]
    if scores:
      x = np.concatenate(scores)
      binary = bool(np.all((x == 0) | (x == 1)))
      out["width"], out["prompt_mean"] = width, float(x.mean())
      out["prompts"] = (power.prompts_for_width(width, p=float(x.mean())) if binary else
                        power.prompts_for_width(width, sd=float(x.std(ddof=1))))
    else:
      acc = [m.summary["eval_acc_final"] for ms in grouped.values() for m in ms
             if math.isfinite(m.summary["eval_acc_final"])]
      if acc:  # no rows: a 0/1 score at the mean final accuracy
        out["width"], out["prompt_mean"] = width, float(np.mean(acc))
        out["prompts"] = power.prompts_for_width(width, p=float(np.mean(acc)))
  return out


def plan_markdown(result: dict[str, Any]) -> str:
  kind = ("paired by seed (the std of same-seed differences to the baseline)" if result["paired"] else
          "two independent groups (the pooled within-group std)")
  lines = [f"## Plan from this pilot: `{result['column']}`", "",
           f"Spread: {result['sd']:.4g} ({kind}, {result['dof']} degrees of freedom). Two-sided t test at "
           "alpha 0.05 with 80% power, its power from the noncentral t distribution; a pilot's std is itself "
           "uncertain, so read these as the order of magnitude.", "",
           "| seeds per group | smallest detectable effect |", "|---|---|"]
  lines += [f"| {n} | {mde:.4g} |" for n, mde in result["mde"].items()]
  if "effect" in result:
    seeds = result["seeds"]
    lines += ["", f"An effect of {result['effect']:g} needs "
              + (f"{seeds} seeds per group." if seeds else "more than 10,000 seeds per group (or no spread).")]
  if "prompts" in result:
    lines += ["", f"A 95% interval of width {result['width']:g} on held-out accuracy near "
              f"{result['prompt_mean']:.3f} needs {result['prompts']} prompts."]
  return "\n".join(lines) + "\n"


def shared_overrides(members: Sequence[MemberRun]) -> dict[str, Any]:
  """The overrides every member of a group sets to the same value."""
  shared = dict(members[0].overrides)
  for m in members[1:]:
    shared = {k: v for k, v in shared.items() if k in m.overrides and m.overrides[k] == v}
  return shared


def _fmt(stat: SeedStat, fmt: str) -> str:
  """'mean [lo, hi]' (the 95% t interval over seeds), or 'mean (1 seed)'."""
  if stat.n == 0:
    return "–"
  if stat.n == 1:
    return f"{fmt.format(stat.mean)} (1 seed)"
  return f"{fmt.format(stat.mean)} [{fmt.format(stat.lo)}, {fmt.format(stat.hi)}]"


def markdown(runs: Sequence[MemberRun], title: str = "Sweep report", baseline: str | None = None,
             primary: Sequence[str] | None = None) -> str:
  """The per-group table, the paired differences to `baseline` (if given), what each group sets, then the
  failed and the unfinished members, as Markdown."""
  table = group_table(runs)
  lines = [f"## {title}", "",
           "Mean over the finished seeds of each group with its 95% t interval over seeds (Student's t: a "
           "bootstrap over fewer than 10 seeds under-covers); n = finished / all members.", "",
           "| group | n | " + " | ".join(header for _, header, _ in columns_of(runs)) + " |",
           "|---|---|" + "---|" * len(columns_of(runs))]
  for row in table:
    cells = [_fmt(row[column], fmt) for column, _, fmt in columns_of(runs)]
    lines.append(f"| {row['group']} | {row['done']}/{row['members']} | " + " | ".join(cells) + " |")
  for section in (task_markdown(runs), "" if baseline is None else paired_markdown(runs, baseline, primary),
                  seeds_and_prompts_markdown(runs, baseline)):
    if section:
      lines += ["", section.rstrip("\n")]
  lines += ["", "### What each group sets", "",
            "Overrides shared by all members of the group (those that differ between its members, like the "
            "seed, are left out):", ""]
  for group, members in groups_in_order(runs).items():
    lines.append(f"- {group}: " + (", ".join(f"`{k}={v}`" for k, v in shared_overrides(members).items())
                                  or "(none recorded)"))
  failed = [m for m in runs if m.status == "failed"]
  if failed:
    lines += ["", "### Failed members", ""]
    for m in failed:
      last = m.error.strip().splitlines()[-1] if m.error.strip() else "(no output)"
      lines.append(f"- `{m.name}` (group {m.group}): `{last}` — full tail in `{m.workdir}/FAILED`")
  unfinished = [m for m in runs if m.status == "unfinished"]
  pending = [m for m in runs if m.status == "pending"]
  if unfinished or pending:
    lines += ["", "### Not finished", ""]
    for m in unfinished:
      steps = "" if not m.rows else f", {int(m.summary['steps'])} steps logged"
      lines.append(f"- `{m.name}` (group {m.group}): unfinished{steps}")
    if pending:
      lines.append(f"- not started ({len(pending)}): " + ", ".join(f"`{m.name}`" for m in pending))
  return "\n".join(lines) + "\n"


TASK_KEYS = ("task.name", "task.options")
# (column, header, format) of the per-task tables: the held-out accuracy at the end, then at the start.
TASK_COLUMNS = [("eval_acc_final", "final eval acc", "{:.3f}"), ("eval_acc_start", "eval acc @0", "{:.3f}"),
                ("constant_answer", "one constant answer", "{:.3f}"),
                ("full_credit_final", "final full-credit share", "{:.3f}")]


def _task_of(overrides: Mapping[str, Any]) -> tuple[str, ...] | None:
  """The (task.name, task.options) overrides of a member as strings, or None when it sets neither."""
  if not any(k in overrides for k in TASK_KEYS):
    return None
  return tuple(spec_lib.format_value(overrides[k]) if k in overrides else "" for k in TASK_KEYS)


def _task_label(task: tuple[str, ...], all_tasks: Sequence[tuple[str, ...]]) -> str:
  """`task.name` without a `reasoning_gym:` prefix; with the options when two tasks share the name."""
  name = task[0][len("reasoning_gym:"):] if task[0].startswith("reasoning_gym:") else task[0]
  if sum(t[0] == task[0] for t in all_tasks) > 1:
    name += f" {task[1]}" if task[1] else " (default options)"
  return name or "(default task)"


def _variant_label(groups: Sequence[str], task_names: Sequence[str]) -> str:
  """What the variant's group names have in common (leading and trailing `_`-separated words); a variant with
  one group: its name with the task's name removed. '(all)' when nothing is left (the sweep varies only the task)."""
  words = [g.split("_") for g in groups]
  if len(groups) == 1:
    label = groups[0]
    for name in task_names:
      label = re.sub(rf"(?:^|_){re.escape(name)}(?=_|$)", "", label)
    return label.strip("_") or "(all)"
  head = 0
  while all(len(w) > head for w in words) and len({tuple(w[:head + 1]) for w in words}) == 1:
    head += 1
  tail = 0
  while (all(len(w) > head + tail for w in words)
         and len({tuple(w[len(w) - tail - 1:]) for w in words}) == 1):
    tail += 1
  kept = words[0][:head] + (words[0][len(words[0]) - tail:] if tail else [])
  return "_".join(kept) or "(all)"


def task_table(runs: Sequence[MemberRun]):
  """(tasks, rows) when the sweep varies the task, else None. tasks: the column labels in order of first
  appearance; rows: [{"variant": label, task label: {column: (mean, std, n)}, ...}] over each (variant, task)
  group's finished members, in order of first appearance."""
  grouped = groups_in_order(runs)
  group_task, group_variant = {}, {}
  for group, members in grouped.items():
    shared = shared_overrides(members)
    tasks = {_task_of(m.overrides) for m in members}
    if len(tasks) != 1:
      return None  # a group that mixes tasks: the sweep is not variant x task
    group_task[group] = tasks.pop()
    group_variant[group] = tuple(sorted((k, spec_lib.format_value(v)) for k, v in shared.items()
                                        if not k.startswith("task.")))
  all_tasks = list(dict.fromkeys(group_task.values()))
  if len(all_tasks) < 2 or None in all_tasks:
    return None
  labels = {t: _task_label(t, all_tasks) for t in all_tasks}
  variants = list(dict.fromkeys(group_variant.values()))
  rows = []
  for variant in variants:
    groups = [g for g in grouped if group_variant[g] == variant]
    names = [labels[group_task[g]].split(" ")[0] for g in groups]
    row: dict[str, Any] = {"variant": _variant_label(groups, names)}
    for g in groups:
      done = [m for m in grouped[g] if m.status == "done"]
      row[labels[group_task[g]]] = {c: mean_std(m.summary[c] for m in done) for c, _, _ in TASK_COLUMNS}
    rows.append(row)
  return [labels[t] for t in all_tasks], rows


def task_markdown(runs: Sequence[MemberRun]) -> str:
  """The per-task tables (one per TASK_COLUMNS metric), or '' when the sweep does not vary the task."""
  table = task_table(runs)
  if table is None:
    return ""
  tasks, rows = table
  lines = []
  for column, header, fmt in TASK_COLUMNS:
    lines += [f"### {header} by task", "",
              "Rows: variants (a group's overrides other than `task.*`); columns: tasks; mean over the "
              "finished seeds with its 95% t interval (n).", "",
              "| variant | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for row in rows:
      cells = [_fmt(row[t][column], fmt) + (f" (n={row[t][column].n})" if row[t][column].n > 1 else "")
               if t in row else "–" for t in tasks]
      lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)


def _stat_header(columns) -> list[str]:
  """`<column>_<field>` for each SeedStat field of each (column, header, format)."""
  return [f"{column}_{field}" for column, _, _ in columns for field in SeedStat._fields]


def tasks_csv(runs: Sequence[MemberRun]) -> str:
  """variant, task, then (mean, std, n) of each TASK_COLUMNS metric: one line per (variant, task) group."""
  out = io.StringIO()
  writer = csv.writer(out)
  writer.writerow(["variant", "task", *_stat_header(TASK_COLUMNS)])
  tasks, rows = task_table(runs) or ([], [])
  for row in rows:
    for t in tasks:
      if t in row:
        writer.writerow([row["variant"], t, *(x for c, _, _ in TASK_COLUMNS for x in row[t][c])])
  return out.getvalue()


def groups_csv(runs: Sequence[MemberRun]) -> str:
  out = io.StringIO()
  writer = csv.writer(out)
  writer.writerow(["group", "members", "done", "failed", *_stat_header(columns_of(runs))])
  for row in group_table(runs):
    writer.writerow([row["group"], row["members"], row["done"], row["failed"],
                     *(x for column, _, _ in columns_of(runs) for x in row[column])])
  return out.getvalue()


def members_csv(runs: Sequence[MemberRun]) -> str:
  out = io.StringIO()
  writer = csv.writer(out)
  columns = [column for column, _, _ in columns_of(runs)] + ["steps"]
  writer.writerow(["name", "group", "status", *columns, "error"])
  for m in runs:
    last = m.error.strip().splitlines()[-1] if m.error.strip() else ""
    writer.writerow([m.name, m.group, m.status, *(m.summary[c] for c in columns), last])
  return out.getvalue()


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average (the first points average what is there), same length as `values`."""
  if window <= 1 or values.size == 0:
    return values
  cumsum = np.cumsum(np.insert(values, 0, 0.0))
  idx = np.arange(1, values.size + 1)
  lo = np.maximum(idx - window, 0)
  return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def _aggregate(curves: Sequence[Mapping[int, float]]):
  """(steps, mean, std, count) over curves {step: value} at each step any of them has; std NaN if count < 2."""
  if not curves:
    return (np.zeros(0, np.int64),) + (np.zeros(0),) * 3
  steps = np.asarray(sorted(set().union(*curves)), np.int64)
  grid = np.asarray([[c.get(s, np.nan) for s in steps.tolist()] for c in curves])
  count = np.isfinite(grid).sum(0)
  mean = np.nansum(grid, 0) / count
  std = np.full(steps.shape, np.nan)
  several = count > 1
  dev = np.where(np.isfinite(grid), grid - mean, 0.0)
  std[several] = np.sqrt((dev ** 2).sum(0)[several] / (count[several] - 1))
  return steps, mean, std, count


def _curve(member: MemberRun, key: str, smooth: int) -> dict[int, float]:
  steps, values = series(member.rows, key)
  return dict(zip(steps.tolist(), _smooth(values, smooth).tolist()))


def band(members: Sequence[MemberRun], key: str, smooth: int = 1):
  """(steps, mean, std, count) over members at each step any of them logged `key`; std is NaN where count < 2."""
  return _aggregate([c for c in (_curve(m, key, smooth) for m in members) if c])


def paired_band(members: Sequence[MemberRun], baseline: Sequence[MemberRun], key: str, smooth: int = 1):
  """Like `band`, of the differences member − baseline member with the same seed, at the steps both logged."""
  base = {spec_lib.seed_of(b.name): _curve(b, key, smooth) for b in baseline}
  diffs = []
  for m in members:
    b = base.get(spec_lib.seed_of(m.name))
    if b is None or spec_lib.seed_of(m.name) is None:
      continue
    c = _curve(m, key, smooth)
    diffs.append({step: c[step] - b[step] for step in c.keys() & b.keys()})
  return _aggregate([d for d in diffs if d])


def interval_band(aggregate):
  """(steps, mean, (lo, hi), count) from `band`'s (steps, mean, std, count): the mean's 95% t interval over the
  members at each step (NaN where fewer than 2 logged it)."""
  steps, mean, std, count = aggregate
  half = intervals.t_half_width(std, count)
  return steps, mean, (mean - half, mean + half), count


def _plotted_groups(runs, include):
  grouped = {g: [m for m in ms if m.status in include] for g, ms in groups_in_order(runs).items()}
  return {g: ms for g, ms in grouped.items() if ms}


def _title(label: str, key: str, smooth: int) -> str:
  return label if key == EVAL_ACC or smooth <= 1 else f"{label}, moving avg {smooth}"


def _floor(members: Sequence[MemberRun]) -> float | None:
  """The mean over members of what one constant answer scores on the held-out set (None: no member logged it)."""
  values = [m.summary["constant_answer"] for m in members if math.isfinite(m.summary["constant_answer"])]
  return float(np.mean(values)) if values else None


def curve_panels(runs: Sequence[MemberRun], smooth: int = 10, include=("done", "unfinished")):
  """The panels of curves.png (plotting.draw_panels' format): reward, held-out accuracy (with each group's
  constant-answer floor where logged, e.g. reasoning-gym tasks) and KL (left out when no member logged one)."""
  grouped = _plotted_groups(runs, include)
  panels = []
  for key, label in CURVES:
    window = 1 if key == EVAL_ACC else smooth
    curves = [(f"{g} (n={len(ms)})", interval_band(band(ms, key, window)), "o" if key == EVAL_ACC else None,
               _floor(ms) if key == EVAL_ACC else None) for g, ms in grouped.items()]
    if key == KL and not any(c[1][0].size for c in curves):
      continue
    title = _title(label, key, smooth)
    if any(c[3] is not None for c in curves):
      title += " (dotted: one constant answer)"
    panels.append((title, curves))
  return panels


def plot(runs: Sequence[MemberRun], path: str, smooth: int = 10, include=("done", "unfinished")) -> None:
  """Mean curve over seeds per group with its 95% t interval, one panel per metric of `curve_panels`."""
  draw_panels(curve_panels(runs, smooth, include), path)


def plot_paired(runs: Sequence[MemberRun], baseline: str, path: str, smooth: int = 10,
                include=("done", "unfinished")) -> None:
  """Mean over seeds of (group − baseline, same seed) with its 95% t interval, for reward and held-out accuracy."""
  grouped = _plotted_groups(runs, include)
  if baseline not in grouped:
    raise ValueError(f"--baseline {baseline!r} is not a group with runs; groups: {list(grouped)}")
  base = grouped[baseline]
  panels = []
  for key, label in CURVES[:2]:
    window = 1 if key == EVAL_ACC else smooth
    panels.append((_title(f"{label} − {baseline} (same seed)", key, smooth),
                   [(g, interval_band(paired_band(ms, base, key, window)), "o" if key == EVAL_ACC else None)
                    for g, ms in grouped.items() if g != baseline]))
  draw_panels(panels, path)


def plot_metrics(runs: Sequence[MemberRun], keys: Sequence[str], path: str, smooth: int = 10,
                 include=("done", "unfinished")) -> None:
  """Mean curve over seeds per group with its 95% t interval for each metric in `keys`, one panel each."""
  grouped = _plotted_groups(runs, include)
  panels = [(_title(key, key, smooth), [(f"{g} (n={len(ms)})", interval_band(band(ms, key, smooth)), None)
                                        for g, ms in grouped.items()]) for key in keys]
  draw_panels(panels, path)


def write_report(sweep_dir: str, out_dir: str | None = None, group_fn=None, smooth: int = 10,
                 title: str | None = None, groups: str | None = None,
                 baseline: str | None = None, extra: Sequence[str] = (),
                 curves: Sequence[str] = (), primary: Sequence[str] | None = None) -> dict[str, str]:
  """Writes summary.md, groups.csv, members.csv and curves.png (tasks.csv for a sweep over tasks, paired.png with a baseline, metrics.png
  with the `curves` metric names) into out_dir (default SWEEP_DIR/report).
  `groups`: a regex (re.search) on group names; only those groups are reported. `baseline`: a group to which
  the others are compared seed by seed (a second table); `primary`: its columns whose comparisons Holm adjusts."""
  runs = select_groups(load_sweep_dir(sweep_dir, group_fn, extra), groups)
  out_dir = out_dir or storage.join(sweep_dir, "report")
  paths = {name: storage.join(out_dir, name) for name in ("summary.md", "groups.csv", "members.csv", "curves.png")}
  texts = {"summary.md": markdown(runs, title or f"Sweep report: {sweep_dir}", baseline, primary),
           "groups.csv": groups_csv(runs), "members.csv": members_csv(runs)}
  if task_table(runs) is not None:
    paths["tasks.csv"] = storage.join(out_dir, "tasks.csv")
    texts["tasks.csv"] = tasks_csv(runs)
  for name, text in texts.items():
    storage.write_text(paths[name], text)
  plot(runs, paths["curves.png"], smooth=smooth)
  if baseline is not None:
    paths["paired.png"] = storage.join(out_dir, "paired.png")
    plot_paired(runs, baseline, paths["paired.png"], smooth=smooth)
  if curves:
    paths["metrics.png"] = storage.join(out_dir, "metrics.png")
    plot_metrics(runs, curves, paths["metrics.png"], smooth=smooth)
  return paths
