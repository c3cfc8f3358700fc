"""What a run reports: `metrics.jsonl` (one JSON object per logged step), TensorBoard event files,
`samples.jsonl` (sampled completions with their rewards), and a console progress bar.

On resume, records after the restored step are dropped from the JSONL files (the killed run may have
logged steps it never checkpointed), and TensorBoard is told to purge them, so each step appears once.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import numpy as np

from grpo_jax.config_checks import Section

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
WARMSTART_FILE = "warmstart.jsonl"


def validate_config(log_cfg) -> None:
  """`config.log`: the cadences, the samples per log, and Weights & Biases' mode."""
  s = Section(log_cfg, "log")
  s.at_least(1, "every", "samples_every")
  s.at_least(0, "num_samples")
  s.one_of("wandb_mode", ("online", "offline"))


def _plain(value: Any):
  """JSON-friendly Python scalars (NaN/inf become None: JSON has no such numbers)."""
  if isinstance(value, (np.generic, np.ndarray)):
    value = value.item() if np.ndim(value) == 0 else value.tolist()
  if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def read_jsonl(path: str) -> list[dict]:
  """Records of a JSONL file; a truncated last line (a run killed mid-write) is ignored."""
  if not os.path.exists(path):
    return []
  out = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def _truncate_jsonl(path: str, last_step: int) -> None:
  """Keeps records with step <= last_step (rewritten atomically)."""
  if not os.path.exists(path):
    return
  keep = [r for r in read_jsonl(path) if r.get("step", -1) <= last_step]
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in keep:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


class MetricsWriter:
  """Appends step records to metrics.jsonl, TensorBoard and Weights & Biases; samples to samples.jsonl (and
  W&B tables).

  `wandb`: keyword arguments of `wandb.init` (project, name, mode, id, config, ...), or None for no W&B. The run
  id is the grpo_jax run's, so a resume continues the same W&B run; W&B keeps the values it first received for
  steps that a resume redoes (metrics.jsonl holds the redone ones).
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, resume_step: int | None = None,
               wandb: dict | None = None):
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    self.metrics_path = os.path.join(workdir, METRICS_FILE)
    self.samples_path = os.path.join(workdir, SAMPLES_FILE)
    if resume_step is None:
      for path in (self.metrics_path, self.samples_path):
        if os.path.exists(path):
          os.remove(path)
    else:
      _truncate_jsonl(self.metrics_path, resume_step)
      _truncate_jsonl(self.samples_path, resume_step)
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      purge = None if resume_step is None else resume_step + 1
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=purge)
    self._wandb = None
    if wandb is not None:
      try:
        import wandb as wandb_lib
      except ImportError as e:
        raise ImportError("config.log.wandb needs the wandb package: pip install 'grpo_jax[wandb]'") from e
      self._wandb = wandb_lib.init(dir=workdir, resume="allow", **wandb)

  def write(self, step: int, metrics: dict[str, Any]) -> dict:
    record = {"step": int(step)}
    record.update({k: _plain(v) for k, v in sorted(metrics.items())})
    with open(self.metrics_path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(k, v, step)
    if self._wandb is not None:
      self._wandb.log({k: v for k, v in record.items() if k != "step"}, step=int(step))
    return record

  def write_event(self, step: int, event: dict[str, Any]) -> None:
    """A row that is not a measurement ({"step", "event": "preempted", ...}): metrics.jsonl only. Readers of
    metrics skip it, as they skip any key they do not plot; a resume keeps it (its step is the saved one)."""
    with open(self.metrics_path, "a") as f:
      f.write(json.dumps({"step": int(step), **{k: _plain(v) for k, v in event.items()}}) + "\n")

  def write_samples(self, step: int, samples: list[dict]) -> None:
    with open(self.samples_path, "a") as f:
      for s in samples:
        f.write(json.dumps({"step": int(step), **{k: _plain(v) for k, v in s.items()}}) + "\n")
    if self._tb is not None and samples:
      text = "\n\n".join(f"`{s['prompt']}` → `{s['completion']}` (reward {s['reward']:.3g})" for s in samples)
      self._tb.add_text("samples", text, step)
    if self._wandb is not None and samples:
      import wandb as wandb_lib
      table = wandb_lib.Table(columns=["step", "prompt", "completion", "reward"])
      for s in samples:
        table.add_data(int(step), s["prompt"], s["completion"], float(s["reward"]))
      self._wandb.log({"samples": table}, step=int(step))

  def flush(self):
    if self._tb is not None:
      self._tb.flush()

  def close(self):
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None


def format_samples(step: int, samples: list[dict]) -> str:
  lines = [f"[samples @ step {step}]"]
  for s in samples:
    lines.append(f"  {s['prompt']!r} -> {s['completion']!r}  reward={s['reward']:.3g}")
  return "\n".join(lines)


class ProgressBar:
  """tqdm bar over GRPO steps with reward / held-out accuracy / KL in its postfix (and tqdm's ETA)."""

  def __init__(self, total: int, initial: int, enabled: bool = True):
    self._bar = None
    if enabled:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total, initial=initial, desc="GRPO", unit="step", dynamic_ncols=True,
                       file=sys.stderr)
    self.accuracy = None

  def update(self, metrics: dict):
    if "eval/accuracy" in metrics:
      self.accuracy = metrics["eval/accuracy"]
    if self._bar is None:
      return
    post = {"reward": f"{metrics.get('reward', float('nan')):.3f}"}
    if self.accuracy is not None:
      post["acc"] = f"{self.accuracy:.3f}"
    if "kl" in metrics:
      post["kl"] = f"{metrics['kl']:.4f}"
    self._bar.set_postfix(post, refresh=False)
    self._bar.update(1)

  def write(self, text: str):
    if self._bar is not None:
      self._bar.write(text, file=sys.stderr)
    else:
      print(text, file=sys.stderr, flush=True)

  def close(self):
    if self._bar is not None:
      self._bar.close()


def wandb_init_kwargs(config, workdir: str, run_id: str, cfg_json: str) -> dict | None:
  """`wandb.init` keyword arguments of the run (config.log.wandb*), or None when W&B logging is off."""
  lg = config.log
  if not lg.wandb:
    return None
  return dict(project=lg.wandb_project, entity=lg.wandb_entity or None, mode=lg.wandb_mode,
              name=lg.wandb_name or os.path.basename(os.path.normpath(workdir)), id=run_id,
              config=json.loads(cfg_json))
