"""Turns a sweep directory into a comparison: `write_report` writes per-group tables (Markdown, CSV) and curves with
seed bands (PNG). The members are read by results.py (which defines each per-member figure), tabled by tables.py
and drawn by figures.py.
"""
from __future__ import annotations

from typing import Sequence

from grpo_jax import storage
from grpo_jax.sweep.figures import curve_panels, metric_panels, paired_panels, wall_clock_panels
from grpo_jax.sweep.results import load_sweep_dir, select_groups
from grpo_jax.sweep.tables import groups_csv, markdown, members_csv, task_table, tasks_csv
from grpo_jax.train.plotting import draw_panels

def write_report(sweep_dir: str, out_dir: str | None = None, group_fn=None, smooth: int = 10,
                 title: str | None = None, groups: str | None = None,
                 baseline: str | None = None, extra: Sequence[str] = (),
                 curves: Sequence[str] = (), primary: Sequence[str] | None = None,
                 wall_clock: bool = False) -> dict[str, str]:
  """Writes summary.md, groups.csv, members.csv (tasks.csv for a sweep over tasks), curves.png (paired.png with a
  baseline, metrics.png with the `curves` metric names, wall_clock.png with `wall_clock`) into out_dir (default
  SWEEP_DIR/report); returns their paths.
  `groups`: a regex (re.search) on group names; only those groups are reported. `baseline`: a group to which
  the others are compared seed by seed (a second table); `primary`: its columns whose comparisons Holm adjusts."""
  runs = select_groups(load_sweep_dir(sweep_dir, group_fn, extra), groups)
  out_dir = out_dir or storage.join(sweep_dir, "report")
  texts = {"summary.md": markdown(runs, title or f"Sweep report: {sweep_dir}", baseline, primary),
           "groups.csv": groups_csv(runs), "members.csv": members_csv(runs)}
  if task_table(runs) is not None:
    texts["tasks.csv"] = tasks_csv(runs)
  figures = {"curves.png": curve_panels(runs, smooth)}
  if baseline is not None:
    figures["paired.png"] = paired_panels(runs, baseline, smooth)
  if curves:
    figures["metrics.png"] = metric_panels(runs, curves, smooth)
  if wall_clock:
    figures["wall_clock.png"] = wall_clock_panels(runs)
  paths = {name: storage.join(out_dir, name) for name in [*texts, *figures]}
  for name, text in texts.items():
    storage.write_text(paths[name], text)
  for name, panels in figures.items():
    draw_panels(panels, paths[name])
  return paths
