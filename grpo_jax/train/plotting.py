"""Figures of training curves, for one run or many: the one drawing routine of the repository.

`plot_runs` draws runs (their metrics.jsonl) as lines: reward, held-out accuracy, KL, entropy and completion
length against the step, and each sampled evaluation figure a run logged (eval_figures.py: pass@k, ...), with its
interval (the run's curves.png, grpo-plot). `draw_panels` draws any panels of curves with
optional bands (mean ± std, or an interval (lo, hi): a held-out figure's logged 95% interval); the ablation
report (grpo_jax/sweep/figures.py) uses it for its group figures.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import os
import select
import subprocess
import sys
import time
from typing import Sequence

import numpy as np

from grpo_jax import storage
from grpo_jax.train.eval_figures import figure_of
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.metrics import read_jsonl

PANELS = (("reward", "reward"), ("eval/accuracy", "held-out accuracy"), ("kl", "KL to reference"),
          ("entropy", "entropy"), ("completions/mean_length", "completion length"))
# Drawn too when some run logged them (multi-turn episodes).
OPTIONAL_PANELS = (("episodes/turns", "messages per episode"),)


def draw_panels(panels, path: str, dpi: int = 80, layout: dict | None = None) -> str:
  """panels: [(title, [(label, (steps, mean, band, count), marker[, floor])] per curve[, x label])] -> one row of
  plots in a PNG (x label: "step" unless given).

  Each curve is a line with a band where it is finite (NaN: no band): `band` is a std (mean ± std) or a pair
  (lo, hi) of arrays, an interval; a curve keeps its color (and
  line style, past 10 curves) across panels; a finite `floor` adds a dotted level line in the curve's color (a
  reference such as what one constant answer scores); a panel without data says "not logged". Returns `path`.
  `layout`: the margins of an earlier figure of the same panels (a redrawing), reused instead of a tight_layout
  pass, which costs as much as the rendering; an empty dict receives this figure's.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cmap = plt.get_cmap("tab10")
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
  legend = {}
  for ax, (title, curves, *xlabel) in zip(axes[0], panels):
    drawn = False
    for i, (label, (steps, mean, std, _), marker, *floor) in enumerate(curves):
      if not steps.size:
        continue
      color, style = cmap(i % 10), ("-", "--", ":")[(i // 10) % 3]
      (line,) = ax.plot(steps, mean, color=color, ls=style, lw=1.4, marker=marker, ms=3)
      legend.setdefault(label, line)
      lo, hi = std if isinstance(std, tuple) else (mean - std, mean + std)
      ok = np.isfinite(lo) & np.isfinite(hi)
      ax.fill_between(steps[ok], lo[ok], hi[ok], color=color, alpha=0.12, lw=0)
      if floor and floor[0] is not None and np.isfinite(floor[0]):
        ax.axhline(floor[0], color=color, ls=":", lw=1.2)
      drawn = True
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel[0] if xlabel else "step")
    ax.grid(alpha=0.3)
    if not drawn:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
  fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(4, max(1, len(legend))),
             fontsize=8, frameon=False)
  rows = -(-len(legend) // 4)
  if layout:
    fig.subplots_adjust(**layout)
  else:
    fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 1))
    if layout is not None:
      p = fig.subplotpars
      layout.update(left=p.left, right=p.right, bottom=p.bottom, top=p.top, wspace=p.wspace, hspace=p.hspace)
  buffer = io.BytesIO()
  fig.savefig(buffer, dpi=dpi, format=os.path.splitext(path)[1][1:] or "png")  # .png, .pdf, .svg ...
  storage.write_bytes(path, buffer.getvalue(), atomic=True)  # a viewer (or a test) never reads half a figure
  plt.close(fig)
  return path


def plot_runs(workdirs: Sequence[str], out_path: str, labels: Sequence[str] | None = None,
              metrics: Sequence[str] | None = None, layout: dict | None = None) -> str:
  """Writes a PNG with one panel per metric and one line per run; returns out_path. The metrics are `metrics`
  (names in metrics.jsonl) if given, else PANELS and those of OPTIONAL_PANELS and the sampled evaluation figures
  that some run logged.

  A metric a run never logged (e.g. `kl` with beta = 0) leaves that run out of the panel.
  """
  if not workdirs:
    raise ValueError("plot_runs: no workdirs given")
  labels = list(labels) if labels else [storage.basename(w) or w for w in workdirs]
  runs = []
  for w in workdirs:
    path = RunFiles(w).metrics
    if not storage.exists(path):
      raise FileNotFoundError(f"{path} does not exist (is {w} a training workdir?)")
    runs.append(read_jsonl(path))
  if metrics:
    logged = sorted({k for rs in runs for r in rs for k, v in r.items() if isinstance(v, (int, float))} - {"step"})
    for name in metrics:
      if name not in logged:
        close = difflib.get_close_matches(name, logged, n=3, cutoff=0.5)
        raise ValueError(f"metric {name!r} was logged by none of the runs; " + (
            f"did you mean {' or '.join(close)}?" if close else
            f"they logged {', '.join(logged[:6])}, ... ({len(logged)} metrics, the keys of metrics.jsonl)"))
    chosen = [(name, name) for name in metrics]
  else:
    logged = dict.fromkeys(k for rs in runs for r in rs for k in r)
    chosen = list(PANELS) + [(k, t) for k, t in OPTIONAL_PANELS if k in logged] + [
        (k, f"held-out {k[5:]}") for k in logged if (f := figure_of(k)) and not f.greedy]
  panels = []
  for key, title in chosen:
    curves = []
    for records, label in zip(runs, labels):
      pts = [(r["step"], r[key], r.get(f"{key}/lo", np.nan), r.get(f"{key}/hi", np.nan)) for r in records
             if r.get(key) is not None]
      steps, values, lo, hi = ((np.asarray(v, np.float64) for v in zip(*pts)) if pts else
                               (np.zeros(0) for _ in range(4)))
      # a figure logged with its interval (eval/accuracy/lo, /hi) is drawn with it as its band
      curves.append((label, (steps, values, (lo, hi), np.ones(values.shape)), "o" if key.startswith("eval/") else None))
    panels.append((title, curves))
  return draw_panels(panels, out_path, dpi=100, layout=layout)


class CurvesRefresher:
  """A run's curves.png redrawn after its evaluations while it trains, by a helper process at the lowest CPU
  priority (Linux's SCHED_IDLE; nice 19 elsewhere) that keeps to half of one core. A drawing costs 0.25 s of
  CPU (0.5-1 s for the first): in the trainer's process, one per evaluation would slow the default experiment
  by 10-30%. The helper draws on cores the run leaves idle, after each evaluation, the default experiment's too
  (2 to 2.5 s apart; 18-19 of its 19 drawn while it trains, at +0.8% wall time, the median of 10 pairs of runs:
  benchmarks/curves_refresh_bench.py); requests that come while it draws merge into one drawing. The final figure
  is drawn when the run finishes (workdir.finish).

    curves = CurvesRefresher(workdir, path, enabled)
    curves.after_eval()   # metrics.jsonl flushed first: the helper reads it
    curves.close()        # waits for the drawing in flight
  """

  def __init__(self, workdir: str, path: str, enabled: bool, log=print):
    self.workdir, self.path, self.enabled, self.log = workdir, path, enabled, log
    self._helper: subprocess.Popen | None = None

  def after_eval(self) -> None:
    """Asks for a drawing of metrics.jsonl as it is on disk now; returns at once."""
    if not self.enabled:
      return
    try:
      if self._helper is None:
        self._helper = subprocess.Popen([sys.executable, "-m", __name__, "--serve", self.workdir, self.path],
                                        stdin=subprocess.PIPE, text=True)
        _lowest_priority(self._helper.pid)  # before its imports: all of it runs there
      self._helper.stdin.write("draw\n")
      self._helper.stdin.flush()
    except OSError as e:  # the helper is gone (its error is on stderr): curves.png waits for the run's end
      self.log(f"[plot] {self.path} is no longer refreshed while the run trains: {type(e).__name__}: {e}")
      self.enabled = False

  def final(self) -> str:
    """Draws the final figure in this process (after `close`); its path."""
    return plot_runs([self.workdir], self.path)

  def close(self, timeout_s: float = 60.0) -> None:
    """Lets the helper finish its drawing and exit (the final drawing follows in the trainer's process)."""
    helper, self._helper = self._helper, None
    if helper is None:
      return
    with contextlib.suppress(OSError):
      helper.stdin.close()
    try:
      helper.wait(timeout_s)
    except subprocess.TimeoutExpired:
      helper.kill()
      helper.wait()


def _lowest_priority(pid: int) -> None:
  """Linux's SCHED_IDLE for process `pid` (it runs only on a core nothing else wants), else nice 19."""
  try:
    os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
  except (AttributeError, OSError):  # not Linux
    os.setpriority(os.PRIO_PROCESS, pid, 19)


def serve(workdir: str, path: str, requests_fd: int = 0, cpu_share: float = 0.5) -> int:
  """CurvesRefresher's helper: one drawing per burst of requests on `requests_fd` (stdin), until it closes;
  returns the number of drawings. After a drawing that took `c` CPU seconds (about 0.25 s once the first has
  imported matplotlib and laid the figure out) the next one starts no sooner than `c / cpu_share` seconds after
  it began (requests meanwhile merge into it), so the helper uses at most that share of one core
  (benchmarks/curves_refresh_bench.py). A failed drawing is said on stderr and the next request tries again."""
  drawings, layout, pending = 0, {}, False
  while pending or os.read(requests_fd, 4096):  # blocks until a request; b"": the trainer closed the pipe
    while select.select([requests_fd], [], [], 0)[0]:  # requests that came during the last drawing: one drawing
      if not os.read(requests_fd, 4096):
        return drawings  # the run's end draws the final figure itself
    began, cpu = time.perf_counter(), time.process_time()
    try:
      plot_runs([workdir], path, layout=layout)
      drawings += 1
    except Exception as e:  # noqa: BLE001 -- a figure must never stop anything
      layout.clear()
      print(f"[plot] {path} not refreshed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    # The first drawing also imports matplotlib and lays the figure out: a one-off, not what later ones cost.
    next_at, pending = began + (time.process_time() - cpu) / cpu_share * (drawings > 1), False
    while (wait := next_at - time.perf_counter()) > 0 and select.select([requests_fd], [], [], wait)[0]:
      if not os.read(requests_fd, 4096):
        return drawings
      pending = True
  return drawings


if __name__ == "__main__":
  if sys.argv[1:2] == ["--serve"] and len(sys.argv) == 4:
    serve(sys.argv[2], sys.argv[3])
  else:
    sys.exit("usage: python -m grpo_jax.train.plotting --serve WORKDIR PNG_PATH")
