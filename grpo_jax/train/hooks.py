"""What happens after a GRPO step, as a list of hooks the loop calls in order (nanodo's periodic actions).

The loop (grpo_jax/train/loop.py) does rollout -> update, wraps the result in a `StepDone` and hands it to each
hook of `after_step_hooks`: they add to its metrics (timings, an evaluation), write them, save a checkpoint, or
end the run (`done.stop`, a raised error). A hook's order in the list is the order its effects happen in.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from grpo_jax import compile_cache

MAX_NONFINITE_STEPS = 3  # consecutive steps of skipped (non-finite) updates that stop a run


@dataclasses.dataclass
class StepDone:
  """One finished step: `state` after its update, the rollout it used, and its metrics (hooks add to them)."""
  step: int
  state: Any          # grpo_jax.train.run.RunState
  rollout: Any        # grpo_jax.train.rollout.Rollout
  metrics: dict
  stop: bool = False  # a hook asks to end the run after this step (the checkpoint hook then saves it)


class Hook:
  """Called with each finished step; `close` runs when the loop ends, also when interrupted."""

  def __call__(self, done: StepDone) -> None:
    raise NotImplementedError

  def close(self) -> None:
    pass


class StopOnDivergence(Hook):
  """FloatingPointError after MAX_NONFINITE_STEPS consecutive steps whose every update was skipped."""

  def __init__(self, settings):
    self.settings, self.streak = settings, 0

  def __call__(self, done: StepDone) -> None:
    s, m = self.settings, done.metrics
    self.streak = self.streak + 1 if m["skipped_updates"] == s.updates_per_step else 0
    if self.streak >= MAX_NONFINITE_STEPS:
      raise FloatingPointError(
          f"steps {done.step - self.streak + 1}..{done.step}: every update had a non-finite loss, gradient or "
          f"result and was skipped (grad_norm {m['grad_norm']}); the last checkpoint holds finite parameters. "
          f"Likely causes: a learning rate too high (optim.learning_rate={s.optim.learning_rate}), float16 "
          f"overflow (model.dtype={s.model.dtype}), or a reward of NaN/inf.")


class FailedSaveStops(Hook):
  """A background save that failed (a full disk) stops the run at this step, not steps later."""

  def __init__(self, checkpointer):
    self.checkpointer = checkpointer

  def __call__(self, done: StepDone) -> None:
    self.checkpointer.check()


class CountTime(Hook):
  """The step's seconds into the run's time split; seconds since the launch where the launcher gave its time."""

  def __init__(self, time_split):
    self.time_split = time_split

  def __call__(self, done: StepDone) -> None:
    self.time_split.add_step(done.metrics)
    if self.time_split.launch_s is not None:
      done.metrics["timing/since_launch_s"] = self.time_split.since_launch()


class Evaluate(Hook):
  """Held-out metrics every `eval.every` steps and at the last; `last` keeps the newest for the summary."""

  def __init__(self, run, last: dict):
    self.run, self.last = run, last

  def __call__(self, done: StepDone) -> None:
    s = self.run.settings
    if done.step % s.eval.every == 0 or done.step == s.num_steps:
      self.last = self.run.evaluate(done.state.params, done.step)
      done.metrics.update(self.last, **eval_time(self.run, done.step))


class Log(Hook):
  """metrics.jsonl, samples, the progress bar and the curves (grpo_jax/persist/workdir.py: Workdir.log_step)."""

  def __init__(self, workdir, bar):
    self.workdir, self.bar = workdir, bar

  def __call__(self, done: StepDone) -> None:
    self.workdir.log_step(done.step, done.metrics, done.rollout, self.bar)

  def close(self) -> None:
    self.bar.close()


class FirstStepReport(Hook):
  """Says what the first step of this process compiled (or loaded from the persistent cache), and in what time."""

  def __init__(self, bar, main: bool):
    self.bar, self.main = bar, main
    self.counter = compile_cache.CompileCounter().start()

  def __call__(self, done: StepDone) -> None:
    if self.counter is None:
      return
    self.counter.stop()
    if self.main:
      self.bar.write(f"[step {done.step}] done in {done.metrics['step_time']:.1f} s ({self.counter.describe()})")
    self.counter = None

  def close(self) -> None:
    if self.counter is not None:
      self.counter.stop()


class Callbacks(Hook):
  """A notebook's `callbacks(step, metrics)`: every one is called; any true result ends the run after the step."""

  def __init__(self, callbacks: Sequence[Callable]):
    self.callbacks = callbacks

  def __call__(self, done: StepDone) -> None:
    done.stop |= any([bool(callback(done.step, dict(done.metrics))) for callback in self.callbacks])


class Save(Hook):
  """A checkpoint every `checkpoint.every` steps, at the last, and when a hook ended the run."""

  def __init__(self, run, workdir):
    self.run, self.workdir = run, workdir

  def __call__(self, done: StepDone) -> None:
    s = self.run.settings
    due = done.step % s.checkpoint.every == 0 or done.step == s.num_steps or done.stop
    if due and self.workdir.saved_step != done.step:  # (a step saved before its hooks: Workdir.save_on_request)
      self.workdir.writer.flush()
      self.workdir.save(self.run, done.state)


def after_step_hooks(run, workdir, bar, inputs, last_eval: dict, first_step: bool) -> list[Hook]:
  """The hooks of a run, in the order they act; `first_step`: whether this process is about to run its first."""
  hooks: list[Hook] = [StopOnDivergence(run.settings), FailedSaveStops(workdir.checkpointer),
                       CountTime(run.time_split), Evaluate(run, last_eval), Log(workdir, bar)]
  if first_step:
    hooks.append(FirstStepReport(bar, workdir.main))
  return hooks + [Callbacks(inputs.callbacks), Save(run, workdir)]


def eval_time(run, step: int) -> dict[str, float]:
  """{"timing/eval_s": seconds} of this process's evaluation at `step` (none after a resume from a checkpoint)."""
  seconds = run.evaluate.seconds.pop(step, None)
  return {} if seconds is None else {"timing/eval_s": seconds}
