"""What a run reports: `metrics.jsonl` (one JSON object per logged step), TensorBoard event files,
`samples.jsonl` (sampled completions with their rewards), and a console progress bar.

On resume, records after the restored step are dropped from the JSONL files (the killed run may have
logged steps it never checkpointed), and TensorBoard is told to purge them, so each step appears once.

In a workdir on an object store (gs://, s3://), which cannot append, the files are written locally and copied
there whole at every `flush` (storage.AppendFile, storage.LocalCopy): the loop flushes before each checkpoint
save, so every row up to a saved step is stored before that checkpoint commits.
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
import time
import uuid
from typing import Any

import numpy as np

from grpo_jax import storage
from grpo_jax.persist.layout import RunFiles


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
  """Records of a JSONL file (local or on a store); a truncated last line (a run killed mid-write) is ignored."""
  if not storage.exists(path):
    return []
  out = []
  for line in filter(None, map(str.strip, storage.read_text(path).splitlines())):
    with contextlib.suppress(json.JSONDecodeError):
      out.append(json.loads(line))
  return out


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch: its writer module imports torch whenever it is installed
  (only to accept torch tensors, which we never pass), a second and a half of every run's start where torch is
  (benchmarks/README.md). A None entry in sys.modules makes `import torch` raise ImportError, which tensorboardX
  expects."""
  if "torch" in sys.modules:  # imported already (a notebook): nothing to save
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


def _truncate_jsonl(path: str, last_step: int) -> None:
  """Keeps records with step <= last_step (rewritten atomically)."""
  if not storage.exists(path):
    return
  keep = [r for r in read_jsonl(path) if r.get("step", -1) <= last_step]
  storage.write_text(path, "".join(json.dumps(r) + "\n" for r in keep), atomic=True)


class MetricsWriter:
  """Appends step records to metrics.jsonl, TensorBoard and Weights & Biases; samples to samples.jsonl (and
  W&B tables).

  `wandb`: keyword arguments of `wandb.init` (project, name, mode, id, config, ...), or None for no W&B. The run
  id is the grpo_jax run's, so a resume continues the same W&B run; W&B keeps the values it first received for
  steps that a resume redoes (metrics.jsonl holds the redone ones).
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, resume_step: int | None = None,
               wandb: dict | None = None):
    files = RunFiles(workdir)
    for path in (files.metrics, files.samples):
      if resume_step is None:
        storage.remove(path)
      else:
        _truncate_jsonl(path, resume_step)
    self._metrics, self._samples = storage.AppendFile(files.metrics), storage.AppendFile(files.samples)
    self._tb = self._tb_dir = None
    if tensorboard:
      SummaryWriter = _summary_writer_class()
      purge = None if resume_step is None else resume_step + 1
      self._tb_dir = storage.LocalCopy(files.tensorboard)
      # Event files are named by the second they were opened: a suffix keeps a resume's from replacing them.
      self._tb = SummaryWriter(self._tb_dir.local, purge_step=purge, filename_suffix="." + uuid.uuid4().hex[:8])
    self._wandb = None
    if wandb is not None:
      try:
        import wandb as wandb_lib
      except ImportError as e:
        raise ImportError("config.log.wandb needs the wandb package: pip install 'grpo_jax[wandb]'") from e
      # W&B keeps its files in a local directory: on a store, its default one.
      self._wandb = wandb_lib.init(dir=None if storage.is_url(workdir) else workdir, resume="allow", **wandb)

  def write(self, step: int, metrics: dict[str, Any]) -> dict:
    record = {"step": int(step), **{k: _plain(v) for k, v in sorted(metrics.items())}}
    self._metrics.write(json.dumps(record) + "\n")
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
    self._metrics.write(json.dumps({"step": int(step), **{k: _plain(v) for k, v in event.items()}}) + "\n")
    self.flush()  # the process is about to end

  def write_samples(self, step: int, samples: list[dict]) -> None:
    self._samples.writelines(json.dumps({"step": int(step), **{k: _plain(v) for k, v in s.items()}}) + "\n"
                             for s in samples)
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
    self._metrics.flush()
    self._samples.flush()
    if self._tb is not None:
      self._tb.flush()
      self._tb_dir.upload()

  def close(self):
    if self._tb is not None:
      self._tb.close()
      self._tb_dir.close()
      self._tb = None
    self._metrics.close()
    self._samples.close()
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None


def format_samples(step: int, samples: list[dict]) -> str:
  lines = [f"  {s['prompt']!r} -> {s['completion']!r}  reward={s['reward']:.3g}" for s in samples]
  return "\n".join([f"[samples @ step {step}]", *lines])


def _duration(seconds: float) -> str:
  return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
      f"{seconds / 3600:.1f} h"


class ProgressBar:
  """Progress over GRPO steps with reward / held-out accuracy / KL: a tqdm bar (with its ETA) on a terminal; where
  stderr is a file (a sweep member's train.log, a cluster's job log) a line per `every_s` seconds instead, plus
  the first step's (which compiles) and the last."""

  def __init__(self, total: int, initial: int, enabled: bool = True, every_s: float = 30.0):
    self._bar = None
    self._lines = enabled and not sys.stderr.isatty()
    self.total, self.done, self.every_s = total, initial, every_s
    self._start_time = self._started = self._last_line = time.time()
    self._first = initial
    if enabled and not self._lines:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total, initial=initial, desc="GRPO", unit="step", dynamic_ncols=True,
                       file=sys.stderr)
    self.accuracy = None

  def update(self, metrics: dict):
    if "eval/accuracy" in metrics:
      self.accuracy = metrics["eval/accuracy"]
    self.done += 1
    post = {"reward": f"{metrics.get('reward', float('nan')):.3f}"}
    if self.accuracy is not None:
      post["acc"] = f"{self.accuracy:.3f}"
    if "kl" in metrics:
      post["kl"] = f"{metrics['kl']:.4f}"
    if self._bar is not None:
      self._bar.set_postfix(post, refresh=False)
      self._bar.update(1)
    elif self._lines:
      now, first = time.time(), self.done == self._first + 1
      if first or self.done == self.total or now - self._last_line >= self.every_s:
        self._last_line = now
        if first:  # it compiles: its time says nothing of the others'
          self._started = now
          timing = f"; the first step (compiling its programs) took {now - self._start_time:.1f} s"
        else:
          per_step = (now - self._started) / (self.done - self._first - 1)
          left = "" if self.done == self.total else f", ~{_duration(per_step * (self.total - self.done))} left"
          timing = f"; {per_step:.2f} s/step{left}"
        print(f"[GRPO] step {self.done}/{self.total}: " + ", ".join(f"{k} {v}" for k, v in post.items()) + timing,
              file=sys.stderr, flush=True)

  def write(self, text: str):
    if self._bar is not None:
      self._bar.write(text, file=sys.stderr)
    else:
      print(text, file=sys.stderr, flush=True)

  def close(self):
    if self._bar is not None:
      self._bar.close()


def wandb_init_kwargs(lg, workdir: str, run_id: str, cfg_json: str) -> dict | None:
  """`wandb.init` keyword arguments of the run (its `log` section `lg`: log.wandb*), or None when W&B logging is
  off."""
  if not lg.wandb:
    return None
  return dict(project=lg.wandb_project, entity=lg.wandb_entity or None, mode=lg.wandb_mode,
              name=lg.wandb_name or storage.basename(workdir), id=run_id,
              config=json.loads(cfg_json))


class NullWriter:
  """Stands in for the metrics writer on processes other than 0: everything written to it is dropped."""

  def write(self, *args, **kwargs):
    """Does nothing; so do write_samples, write_event, flush and close."""

  write_samples = write_event = flush = close = write
