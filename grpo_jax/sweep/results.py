"""A sweep's members read back for its report: status, metrics and the figures compared across groups.

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
  final:<figure>  every other evaluation figure it logged (grpo_jax/train/eval_figures.py, e.g. `eval/pass@4`), at
                  the last step that has it,
  mean:<metric>   for metrics asked for with --mean_of: the mean over the steps that logged it.
"""
from __future__ import annotations

import contextlib
import math
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from grpo_jax import storage
from grpo_jax.data.tasks import CONSTANT_ANSWER_METRIC
from grpo_jax.sweep import runner
from grpo_jax.sweep import spec as spec_lib
from grpo_jax.train.eval_figures import figure_of
from grpo_jax.persist.layout import RunFiles, sweep_file
from grpo_jax.persist.metrics import read_jsonl

REWARD, EVAL_ACC, KL, LENGTH, STEP_TIME = "reward", "eval/accuracy", "kl", "completions/mean_length", "step_time"
FULL_CREDIT = "eval/full_credit"


def read_metrics(path: str) -> dict[int, dict[str, Any]]:
  """step -> merged metrics. Unparseable lines (e.g. a line cut short by a kill) are skipped."""
  rows: dict[int, dict[str, Any]] = {}
  for row in read_jsonl(path):
    with contextlib.suppress(ValueError, KeyError, TypeError):
      rows.setdefault(int(row["step"]), {}).update(row)
  return rows


def series(rows: Mapping[int, Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the steps where `key` is a finite number, in step order."""
  logged = [(step, float(v)) for step in sorted(rows) if isinstance(v := rows[step].get(key), (int, float))
            and not isinstance(v, bool) and math.isfinite(v)]
  return np.asarray([s for s, _ in logged], np.int64), np.asarray([v for _, v in logged], np.float64)


def summarize(rows: Mapping[int, Mapping[str, Any]], wall_s: float | None = None,
              extra: Sequence[str] = ()) -> dict[str, float]:
  """The per-member numbers of the module docstring; NaN where the metric was never logged. For each metric
  name in `extra`, `mean:<name>` is its mean over the steps that logged it."""
  def of(key: str, pick: Callable[[np.ndarray], float]) -> float:  # NaN when `key` was never logged
    _, values = series(rows, key)
    return pick(values) if values.size else math.nan

  first, last, mean = (lambda v: v[0]), (lambda v: v[-1]), (lambda v: v.mean())
  _, step_time = series(rows, STEP_TIME)
  if wall_s is None:
    wall_s = float(step_time.sum()) if step_time.size else math.nan
  return {
      "eval_acc_start": of(EVAL_ACC, first),
      "eval_acc_final": of(EVAL_ACC, last),
      "constant_answer": of(CONSTANT_ANSWER_METRIC, first),
      "full_credit_final": of(FULL_CREDIT, last),
      "reward_auc": of(REWARD, mean),
      "kl_final": of(KL, last),
      "mean_length": of(LENGTH, mean),
      "steps_per_s": 1.0 / np.median(step_time) if step_time.size and np.median(step_time) > 0 else math.nan,
      "wall_s": wall_s,
      "steps": float(max(rows)) if rows else math.nan,
      **{f"final:{key}": of(key, last) for key in dict.fromkeys(k for row in rows.values() for k in row)
         if key not in (EVAL_ACC, FULL_CREDIT) and figure_of(key)},
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
    marker = runner.read_json(self.files.done if self.status == "done" else self.files.failed)
    # A marker written before runner.member_wall_s existed may have missed an attempt killed without a trace.
    walls = [w for w in ((marker or {}).get("wall_s"), runner.member_wall_s(workdir)) if w]
    self.error = (marker or {}).get("error", "") if self.status == "failed" else ""
    self.summary = summarize(self.rows, max(walls, default=None), self.extra)
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
  planned = (runner.read_json(sweep_file(sweep_dir)) or {}).get("members", [])
  entries = [(m["name"], m.get("group"), m.get("overrides")) for m in planned]
  known = {name for name, _, _ in entries}
  for name in sorted(storage.listdir(sweep_dir)):
    workdir = storage.join(sweep_dir, name)
    if name in known or not storage.isdir(workdir):
      continue
    info = runner.read_json(RunFiles(workdir).member)
    if info is None and not storage.exists(RunFiles(workdir).metrics):
      continue
    entries.append((name, (info or {}).get("group"), (info or {}).get("overrides")))
  if not entries:
    raise ValueError(f"{sweep_dir!r} holds no sweep members (no sweep.json, no member workdirs)")
  entries = [(name, group or spec_lib.default_group(name), overrides) for name, group, overrides in entries]
  return [MemberRun(name, group_fn(name, group) if group_fn else group, storage.join(sweep_dir, name), overrides, extra)
          for name, group, overrides in entries]


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
    return match.group("group" if "group" in compiled.groupindex else 1 if compiled.groups else 0)

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
  return {group: [r for r in runs if r.group == group] for group in dict.fromkeys(r.group for r in runs)}


def same_seed_pairs(members: Sequence[MemberRun], baseline: Sequence[MemberRun]) -> list[tuple[MemberRun, MemberRun]]:
  """(member, the baseline member with the same seed, the `_seed<N>` suffix) for the finished members of both."""
  base = {spec_lib.seed_of(b.name): b for b in baseline if b.status == "done" and spec_lib.seed_of(b.name) is not None}
  return [(m, base[spec_lib.seed_of(m.name)]) for m in members
          if m.status == "done" and spec_lib.seed_of(m.name) in base]


def shared_overrides(members: Sequence[MemberRun]) -> dict[str, Any]:
  """The overrides every member of a group sets to the same value."""
  return {k: v for k, v in members[0].overrides.items()
          if all(k in m.overrides and m.overrides[k] == v for m in members[1:])}
