"""Where a run's wall-clock goes, for summary.json's `time_split_s` (one process's share of the run).

  launch      process start -> `train()` called: the interpreter, imports, the config (Linux; else absent)
  start       `train()` -> the first step begins: building the run, loading the model, restore or warm start,
              less the evaluation and checkpoint time spent in it (counted below)
  sample, reward, reference, update, sync, step_other
              the steps' phases (the sums of the `timing/*` metrics: each second of a step counted once, in the step
              that spent it; overlapped, update is what the update kept the loop waiting beyond the sampling done
              meanwhile); the first step's compilation is in them
  eval        held-out evaluations, the one before step 1 included
  checkpoint  the blocking part of checkpoint saves (an async save finishes its writes in the background)
  finish      after the last step: the Hugging Face export, the wait for the last async save, the plot
  first_step_excess
              the first step's time minus the median of the others: about the compile time (not additive)

`launch_to_first_step_s` is process start -> the end of the first GRPO step, what a user waits for before the
run shows its first update. Per step, metrics.jsonl has `timing/since_launch_s` (process start -> the end of the
step's update, before its evaluation) and, where it evaluated, `timing/eval_s`: a curve of accuracy against
time since launch, with or without the evaluations' time (benchmarks/learning_race.py).
"""
from __future__ import annotations

import collections
import contextlib
import os
import statistics
import time

ORDER = ("start", "eval", "checkpoint", "sample", "reward", "reference", "update", "sync", "step_other")
STEP_PHASES = {"timing/sample_s": "sample", "timing/reward_s": "reward", "timing/reference_s": "reference",
               "timing/update_s": "update", "timing/sync_s": "sync", "timing/other_s": "step_other"}


def seconds_since_launch() -> float | None:
  """Seconds since this process started (Linux /proc), or None where that cannot be read."""
  try:
    with open("/proc/self/stat") as f:
      fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time in ticks since boot
  except (OSError, ValueError, IndexError):
    return None


class TimeSplit:
  """Seconds per part of a run (module docstring); `phase(name)` times a block, `add_step` a step's metrics."""

  def __init__(self):
    self.seconds = collections.Counter()
    self.step_times: list[float] = []
    self.launch_s = seconds_since_launch()
    self.t_start = time.time()
    self.launch_to_first_step_s = None
    self.t_steps_end = None

  @contextlib.contextmanager
  def phase(self, name: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[name] += time.perf_counter() - t0

  def steps_begin(self) -> None:
    """Marks the end of start-up (what eval and checkpoints took in it is theirs)."""
    self.seconds["start"] = time.time() - self.t_start - self.seconds["eval"] - self.seconds["checkpoint"]

  def steps_end(self) -> None:
    self.t_steps_end = time.time()

  def add_step(self, metrics: dict) -> None:
    for key, name in STEP_PHASES.items():
      self.seconds[name] += float(metrics.get(key, 0.0))
    self.step_times.append(float(metrics["step_time"]))
    if self.launch_to_first_step_s is None:
      self.launch_to_first_step_s = self.since_launch()

  def since_launch(self) -> float | None:
    """Seconds from this process's start to now, or None where the start cannot be read."""
    return None if self.launch_s is None else self.launch_s + time.time() - self.t_start

  def as_dict(self) -> dict[str, float]:
    out = {} if self.launch_s is None else {"launch": round(self.launch_s, 3)}
    out.update({name: round(self.seconds[name], 3) for name in ORDER if name in self.seconds})
    if self.t_steps_end is not None:
      out["finish"] = round(time.time() - self.t_steps_end, 3)
    if len(self.step_times) > 1:
      out["first_step_excess"] = round(self.step_times[0] - statistics.median(self.step_times[1:]), 3)
    return out
