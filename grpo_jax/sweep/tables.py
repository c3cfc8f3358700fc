"""The report's tables (Markdown, CSV) of a sweep's members (results.py): per group, paired by seed against a
baseline, per task, and the plan a pilot gives the next study; the statistics are grpo_jax/stats/'s.

Per group: the mean over the group's finished members ('done') with its 95% Student's t interval over seeds,
the sample standard deviation (ddof=1) and n (groups.csv has them all).

Sweeps over tasks ("variant × task" studies, e.g. experiments/gym.py's get_sweep): when the members' `task.name`
or `task.options` overrides take more than one value, the report adds one table per TASK_COLUMNS metric with a
row per variant and a column per task (`task_table`, tasks.csv). A variant is the set of a group's shared
overrides other than `task.*`; its label is what its groups' names have in common (the task part removed).
"""
from __future__ import annotations

import csv
import io
import math
import re
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from grpo_jax.stats import comparisons, intervals, power
from grpo_jax.sweep import spec as spec_lib
from grpo_jax.sweep.results import MemberRun, groups_in_order, same_seed_pairs, shared_overrides

# (column, header, format) of the per-group table, in order.
COLUMNS = [("eval_acc_start", "eval acc @0", "{:.3f}"), ("eval_acc_final", "final eval acc", "{:.3f}"),
           ("reward_auc", "reward AUC", "{:.3f}"), ("kl_final", "final KL", "{:.2e}"),
           ("mean_length", "mean length", "{:.2f}"), ("steps_per_s", "steps/s", "{:.2f}"),
           ("wall_s", "wall (s)", "{:.0f}")]


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
  """COLUMNS, a `final:<figure>` column per further evaluation figure some run logged, and a `mean:<metric>` column
  per extra metric the runs were loaded with."""
  figures = dict.fromkeys(c for m in runs for c in m.summary if c.startswith("final:"))
  return (COLUMNS + [(c, f"final {c.split('/', 1)[1]}", "{:.3f}") for c in figures]
          + [(f"mean:{key}", f"mean {key}", "{:.3g}") for key in (runs[0].extra if runs else ())])


def group_table(runs: Sequence[MemberRun]) -> list[dict[str, Any]]:
  """One dict per group: counts by status and (mean, std, n) of every column over its finished members."""
  table = []
  for group, members in groups_in_order(runs).items():
    done = [m for m in members if m.status == "done"]
    row: dict[str, Any] = {"group": group, "members": len(members), "done": len(done),
                           "failed": sum(m.status == "failed" for m in members)}
    for column, _, _ in columns_of(runs):
      row[column] = mean_std(m.summary.get(column, math.nan) for m in done)
    table.append(row)
  return table


PAIRED_COLUMNS = [("eval_acc_final", "Δ final eval acc", "{:+.3f}"), ("reward_auc", "Δ reward AUC", "{:+.3f}")]


def paired_columns(runs: Sequence[MemberRun]):
  """PAIRED_COLUMNS plus a Δ column per `--mean_of` metric the runs were loaded with."""
  return PAIRED_COLUMNS + [(column, f"Δ {header}", "{:+.3g}") for column, header, _ in columns_of(runs)[len(COLUMNS):]]


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
      differences = [m.summary.get(column, math.nan) - b.summary.get(column, math.nan) for m, b in pairs]
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
  table, columns = paired_table(runs, baseline, primary), paired_columns(runs)
  lines = [f"### Paired by seed: difference to `{baseline}`", "",
           "Mean of (group − baseline) over the seeds both finished, with its 95% t interval over seeds, the "
           "two-sided p value of a one-sample t test, and in brackets the seeds where the group is higher. The "
           "primary comparisons (--primary columns, default the first) get Holm's adjustment over all of them; the "
           "other cells are exploratory, their p unadjusted.", "",
           *_table(["group", "pairs", *(header for _, header, _ in columns)],
                   ([row["group"], row["pairs"], *(_paired_cell(row, c, fmt) for c, _, fmt in columns)]
                    for row in table)),
           "", f"Probability of improvement over `{baseline}`: P(a run of the group scores higher than a run of "
           "the baseline), ties counting 1/2: the share of the same-seed pairs where the group is higher, with a "
           "95% percentile bootstrap interval over the pairs.", "",
           *_table(["group", *(header.replace("Δ ", "") for _, header, _ in columns)],
                   ([row["group"], *(_poi_cell(row, c) for c, _, _ in columns)] for row in table))]
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
           *_table(["group", "seeds", "mean [95% t interval over seeds]", "mean [95% two-level bootstrap]",
                    "SE from seeds", "SE from prompts"],
                   ([r["label"], r["n"], f"{(two := r['two_level']).mean:+.3f} [{r['t'].lo:+.3f}, {r['t'].hi:+.3f}]",
                     f"{two.mean:+.3f} [{two.interval.lo:+.3f}, {two.interval.hi:+.3f}]", f"{two.seed_sd:.3f}",
                     f"{two.prompt_sd:.3f}"] for r in rows))]
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
    acc = [v for ms in grouped.values() for m in ms if math.isfinite(v := m.summary["eval_acc_final"])]
    x = np.concatenate(scores) if scores else np.asarray(acc)  # no rows: a 0/1 score at the mean final accuracy
    if x.size:
      out["width"], out["prompt_mean"] = width, float(x.mean())
      binary = not scores or bool(np.all((x == 0) | (x == 1)))
      out["prompts"] = power.prompts_for_width(width, **({"p": float(x.mean())} if binary else
                                                          {"sd": float(x.std(ddof=1))}))
  return out


def plan_markdown(result: dict[str, Any]) -> str:
  kind = ("paired by seed (the std of same-seed differences to the baseline)" if result["paired"] else
          "two independent groups (the pooled within-group std)")
  lines = [f"## Plan from this pilot: `{result['column']}`", "",
           f"Spread: {result['sd']:.4g} ({kind}, {result['dof']} degrees of freedom). Two-sided t test at "
           "alpha 0.05 with 80% power, its power from the noncentral t distribution; a pilot's std is itself "
           "uncertain, so read these as the order of magnitude.", "",
           *_table(["seeds per group", "smallest detectable effect"],
                   ([n, f"{mde:.4g}"] for n, mde in result["mde"].items()))]
  if "effect" in result:
    seeds = result["seeds"]
    lines += ["", f"An effect of {result['effect']:g} needs "
              + (f"{seeds} seeds per group." if seeds else "more than 10,000 seeds per group (or no spread).")]
  if "prompts" in result:
    lines += ["", f"A 95% interval of width {result['width']:g} on held-out accuracy near "
              f"{result['prompt_mean']:.3f} needs {result['prompts']} prompts."]
  return "\n".join(lines) + "\n"


def _table(header: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
  """The lines of a Markdown table."""
  return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(map(str, r))} |" for r in rows)]


def _last_line(text: str) -> str:
  return text.strip().splitlines()[-1] if text.strip() else ""


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
  lines = [f"## {title}", "",
           "Mean over the finished seeds of each group with its 95% t interval over seeds (Student's t: a "
           "bootstrap over fewer than 10 seeds under-covers); n = finished / all members.", "",
           *_table(["group", "n", *(header for _, header, _ in columns_of(runs))],
                   ([row["group"], f"{row['done']}/{row['members']}",
                     *(_fmt(row[c], fmt) for c, _, fmt in columns_of(runs))] for row in group_table(runs)))]
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
      lines.append(f"- `{m.name}` (group {m.group}): `{_last_line(m.error) or '(no output)'}` — full tail in "
                   f"`{m.workdir}/FAILED`")
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


def _task_cell(stats: Mapping[str, SeedStat] | None, column: str, fmt: str) -> str:
  stat = stats[column] if stats else None
  return "–" if stat is None else _fmt(stat, fmt) + (f" (n={stat.n})" if stat.n > 1 else "")


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
              *_table(["variant", *tasks], ([row["variant"], *(_task_cell(row.get(t), column, fmt) for t in tasks)]
                                            for row in rows)), ""]
  return "\n".join(lines)


def _stat_header(columns) -> list[str]:
  """`<column>_<field>` for each SeedStat field of each (column, header, format)."""
  return [f"{column}_{field}" for column, _, _ in columns for field in SeedStat._fields]


def _csv(header: Sequence[str], rows: Iterable[Sequence]) -> str:
  out = io.StringIO()
  csv.writer(out).writerows([header, *rows])
  return out.getvalue()


def tasks_csv(runs: Sequence[MemberRun]) -> str:
  """variant, task, then (mean, std, n) of each TASK_COLUMNS metric: one line per (variant, task) group."""
  tasks, rows = task_table(runs) or ([], [])
  return _csv(["variant", "task", *_stat_header(TASK_COLUMNS)],
              ([row["variant"], t, *(x for c, _, _ in TASK_COLUMNS for x in row[t][c])]
               for row in rows for t in tasks if t in row))


def groups_csv(runs: Sequence[MemberRun]) -> str:
  return _csv(["group", "members", "done", "failed", *_stat_header(columns_of(runs))],
              ([row["group"], row["members"], row["done"], row["failed"],
                *(x for column, _, _ in columns_of(runs) for x in row[column])] for row in group_table(runs)))


def members_csv(runs: Sequence[MemberRun]) -> str:
  columns = [column for column, _, _ in columns_of(runs)] + ["steps"]
  return _csv(["name", "group", "status", *columns, "error"],
              ([m.name, m.group, m.status, *(m.summary.get(c, math.nan) for c in columns), _last_line(m.error)]
               for m in runs))
