"""Training curves of one or more runs (their metrics.jsonl) on one figure: reward, held-out accuracy, KL,
entropy and completion length against the step."""
from __future__ import annotations

import os
from typing import Sequence

from grpo_jax.train.metrics import METRICS_FILE, read_jsonl

PANELS = (("reward", "reward"), ("eval/accuracy", "held-out accuracy"), ("kl", "KL to reference"),
          ("entropy", "entropy"), ("completions/mean_length", "completion length"))


def plot_runs(workdirs: Sequence[str], out_path: str, labels: Sequence[str] | None = None) -> str:
  """Writes a PNG with one panel per metric and one line per run; returns out_path.

  A metric a run never logged (e.g. `kl` with beta = 0) leaves that run out of the panel.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  if not workdirs:
    raise ValueError("plot_runs: no workdirs given")
  labels = list(labels) if labels else [os.path.basename(os.path.normpath(w)) or w for w in workdirs]
  runs = []
  for w in workdirs:
    path = os.path.join(w, METRICS_FILE)
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} does not exist (is {w} a training workdir?)")
    runs.append(read_jsonl(path))
  fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
  for ax, (key, title) in zip(axes, PANELS):
    drawn = False
    for records, label in zip(runs, labels):
      pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
      if pts:
        steps, values = zip(*pts)
        ax.plot(steps, values, marker="o" if key.startswith("eval/") else None, markersize=3, label=label)
        drawn = True
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if not drawn:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
  if len(workdirs) > 1:
    axes[0].legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, dpi=100)
  plt.close(fig)
  return out_path
