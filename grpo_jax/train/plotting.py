"""Figures of training curves, for one run or many: the one drawing routine of the repository.

`plot_runs` draws runs (their metrics.jsonl) as lines: reward, held-out accuracy, KL, entropy and completion
length against the step (the run's curves.png, grpo-plot). `draw_panels` draws any panels of curves with
optional bands (mean ± std); the ablation report (grpo_jax/sweep/report.py) uses it for its group figures.
"""
from __future__ import annotations

import io
import os
import threading
import time
from typing import Sequence

import numpy as np

from grpo_jax import storage
from grpo_jax.train.metrics import METRICS_FILE, read_jsonl

PANELS = (("reward", "reward"), ("eval/accuracy", "held-out accuracy"), ("kl", "KL to reference"),
          ("entropy", "entropy"), ("completions/mean_length", "completion length"))
# Drawn too when some run logged them (multi-turn episodes).
OPTIONAL_PANELS = (("episodes/turns", "messages per episode"),)


def draw_panels(panels, path: str, dpi: int = 80) -> str:
  """panels: [(title, [(label, (steps, mean, std, count), marker[, floor])] per curve)] -> one row of plots in a PNG.

  Each curve is a line with a band of ± std where std is finite (NaN: no band); a curve keeps its color (and
  line style, past 10 curves) across panels; a finite `floor` adds a dotted level line in the curve's color (a
  reference such as what one constant answer scores); a panel without data says "not logged". Returns `path`.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cmap = plt.get_cmap("tab10")
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
  legend = {}
  for ax, (title, curves) in zip(axes[0], panels):
    drawn = False
    for i, (label, (steps, mean, std, _), marker, *floor) in enumerate(curves):
      if not steps.size:
        continue
      color, style = cmap(i % 10), ("-", "--", ":")[(i // 10) % 3]
      (line,) = ax.plot(steps, mean, color=color, ls=style, lw=1.4, marker=marker, ms=3)
      legend.setdefault(label, line)
      ok = np.isfinite(std)
      ax.fill_between(steps[ok], (mean - std)[ok], (mean + std)[ok], color=color, alpha=0.12, lw=0)
      if floor and floor[0] is not None and np.isfinite(floor[0]):
        ax.axhline(floor[0], color=color, ls=":", lw=1.2)
      drawn = True
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if not drawn:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
  fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(4, max(1, len(legend))),
             fontsize=8, frameon=False)
  rows = -(-len(legend) // 4)
  fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 1))
  if storage.is_url(path):  # matplotlib writes to a buffer, stored whole
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    storage.write_bytes(path, buffer.getvalue())
  else:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path


def plot_runs(workdirs: Sequence[str], out_path: str, labels: Sequence[str] | None = None,
              metrics: Sequence[str] | None = None) -> str:
  """Writes a PNG with one panel per metric and one line per run; returns out_path. The metrics are `metrics`
  (names in metrics.jsonl) if given, else PANELS and those of OPTIONAL_PANELS that some run logged.

  A metric a run never logged (e.g. `kl` with beta = 0) leaves that run out of the panel.
  """
  if not workdirs:
    raise ValueError("plot_runs: no workdirs given")
  labels = list(labels) if labels else [storage.basename(w) or w for w in workdirs]
  runs = []
  for w in workdirs:
    path = storage.join(w, METRICS_FILE)
    if not storage.exists(path):
      raise FileNotFoundError(f"{path} does not exist (is {w} a training workdir?)")
    runs.append(read_jsonl(path))
  if metrics:
    chosen = [(name, name) for name in metrics]
  else:
    chosen = list(PANELS) + [(k, t) for k, t in OPTIONAL_PANELS if any(k in r for rs in runs for r in rs)]
  panels = []
  for key, title in chosen:
    curves = []
    for records, label in zip(runs, labels):
      pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
      steps, values = (np.asarray(v, np.float64) for v in zip(*pts)) if pts else (np.zeros(0), np.zeros(0))
      curves.append((label, (steps, values, np.full(values.shape, np.nan), np.ones(values.shape)),
                     "o" if key.startswith("eval/") else None))
    panels.append((title, curves))
  return draw_panels(panels, out_path, dpi=100)


class CurvesRefresher:
  """A run's curves.png redrawn after its evaluations while it trains, in a background thread. A drawing takes
  about 0.4 s of CPU, so it is redrawn at most every `min_interval_s` and every 20 drawing times: a run of
  minutes per step gets a current figure at each evaluation, the default experiment (under a minute of steps)
  at most one extra drawing. The final figure is drawn when the run finishes (workdir.finish)."""

  def __init__(self, workdir: str, path: str, enabled: bool, min_interval_s: float = 60.0, log=print):
    self.workdir, self.path, self.enabled, self.min_interval_s, self.log = workdir, path, enabled, min_interval_s, log
    self._thread: threading.Thread | None = None
    self._last = time.time()  # the first drawing waits an interval: a run's first minute has little to show
    self._cost = 0.0

  def after_eval(self) -> None:
    """Starts a drawing unless one is running or the last was too recent; returns at once."""
    now = time.time()
    if (not self.enabled or (self._thread is not None and self._thread.is_alive())
        or now - self._last < max(self.min_interval_s, 20 * self._cost)):
      return
    self._last = now
    self._thread = threading.Thread(target=self._draw, name="curves", daemon=True)
    self._thread.start()

  def _draw(self) -> None:
    t0 = time.time()
    try:
      plot_runs([self.workdir], self.path)
    except Exception as e:  # a figure must never stop the training
      self.log(f"[plot] {self.path} not refreshed: {type(e).__name__}: {e}")
      self.enabled = False
    self._cost = time.time() - t0

  def close(self) -> None:
    """Waits for a drawing in flight (the final one follows)."""
    if self._thread is not None:
      self._thread.join()
