"""The report's figures: each group's mean curve over seeds with its 95% t interval (grpo_jax/stats/intervals.py),
of the metrics themselves (curves.png, metrics.png), of the same-seed differences to a baseline (paired.png) and of
the held-out accuracy against seconds (wall_clock.png), as panels for grpo_jax/train/plotting.py's draw_panels."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from grpo_jax.stats import intervals
from grpo_jax.sweep import spec as spec_lib
from grpo_jax.sweep.results import EVAL_ACC, KL, REWARD, MemberRun, groups_in_order, series

CURVES = [(REWARD, "reward (train)"), (EVAL_ACC, "held-out accuracy"), (KL, "KL to reference")]


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
  diffs = [{step: c[step] - b[step] for step in c.keys() & b.keys()} for m in members
           if spec_lib.seed_of(m.name) is not None and (b := base.get(spec_lib.seed_of(m.name))) is not None
           for c in [_curve(m, key, smooth)]]
  return _aggregate([d for d in diffs if d])


def interval_band(aggregate):
  """(steps, mean, (lo, hi), count) from `band`'s (steps, mean, std, count): the mean's 95% t interval over the
  members at each step (NaN where fewer than 2 logged it)."""
  steps, mean, std, count = aggregate
  half = intervals.t_half_width(std, count)
  return steps, mean, (mean - half, mean + half), count


def _plotted_groups(runs, include=("done", "unfinished")):
  return {g: chosen for g, ms in groups_in_order(runs).items() if (chosen := [m for m in ms if m.status in include])}


def _title(label: str, key: str, smooth: int) -> str:
  return label if key == EVAL_ACC or smooth <= 1 else f"{label}, moving avg {smooth}"


def _floor(members: Sequence[MemberRun]) -> float | None:
  """The mean over members of what one constant answer scores on the held-out set (None: no member logged it)."""
  values = [m.summary["constant_answer"] for m in members if math.isfinite(m.summary["constant_answer"])]
  return float(np.mean(values)) if values else None


def curve_panels(runs: Sequence[MemberRun], smooth: int = 10):
  """The panels of curves.png (plotting.draw_panels' format): reward, held-out accuracy (with each group's
  constant-answer floor where logged, e.g. reasoning-gym tasks) and KL (left out when no member logged one)."""
  grouped = _plotted_groups(runs)
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


def paired_panels(runs: Sequence[MemberRun], baseline: str, smooth: int = 10):
  """The panels of paired.png: the mean over seeds of (group − baseline, same seed) with its 95% t interval, for
  reward and held-out accuracy."""
  grouped = _plotted_groups(runs)
  if baseline not in grouped:
    raise ValueError(f"--baseline {baseline!r} is not a group with runs; groups: {list(grouped)}")
  return [(_title(f"{label} − {baseline} (same seed)", key, smooth),
           [(g, interval_band(paired_band(ms, grouped[baseline], key, 1 if key == EVAL_ACC else smooth)),
             "o" if key == EVAL_ACC else None) for g, ms in grouped.items() if g != baseline])
          for key, label in CURVES[:2]]


def metric_panels(runs: Sequence[MemberRun], keys: Sequence[str], smooth: int = 10):
  """The panels of metrics.png: the mean curve over seeds per group with its 95% t interval for each metric in
  `keys`, one panel each."""
  grouped = _plotted_groups(runs)
  return [(_title(key, key, smooth), [(f"{g} (n={len(ms)})", interval_band(band(ms, key, smooth)), None)
                                      for g, ms in grouped.items()]) for key in keys]


def _seconds(member: MemberRun) -> dict[int, float]:
  """{step: the seconds of the member's steps and evaluations up to it} (step_time, timing/eval_s)."""
  total, out = 0.0, {}
  for step in sorted(member.rows):
    total += float(member.rows[step].get("step_time", 0.0)) + float(member.rows[step].get("timing/eval_s", 0.0))
    out[step] = total
  return out


def wall_clock_panels(runs: Sequence[MemberRun]):
  """The panel of wall_clock.png: each group's held-out accuracy at each evaluation (mean over seeds, 95% t
  interval) against the mean over those seeds of the seconds their steps and evaluations took up to it (each
  step's step_time, compilation included, and timing/eval_s; not the process's start or a warm start)."""
  curves = []
  for g, ms in _plotted_groups(runs).items():
    steps, mean, interval, count = interval_band(band(ms, EVAL_ACC))
    seconds = [_seconds(m) for m in ms]
    x = np.asarray([np.mean([s[k] for s in seconds if k in s]) for k in steps.tolist()])
    curves.append((f"{g} (n={len(ms)})", (x, mean, interval, count), "o"))
  return [("held-out accuracy against seconds", curves, "seconds of steps and evaluations")]
