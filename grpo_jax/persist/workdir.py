"""A run's workdir: the check before a resume, and `Workdir`, the one object through which the loop writes there
(config.json, run id, starting point, checkpoints, metrics, samples, curves, summary.json at the end). The files'
names: grpo_jax/persist/layout.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import uuid
from typing import Any

import numpy as np

from grpo_jax import config as config_lib
from grpo_jax import errors
from grpo_jax import storage
from grpo_jax.persist import metrics as metrics_lib
from grpo_jax.persist import checkpoint as checkpoint_lib
from grpo_jax.persist import preemption as preemption_lib
from grpo_jax.persist.layout import RunFiles


@dataclasses.dataclass
class Summary:
  """summary.json. Seconds: `wall_s_this_process` is this process's own time (it includes a warm start it ran,
  not one loaded with warmstart.init_checkpoint); `wall_s_total` adds the time earlier processes of the same run
  (same workdir, same run id) spent up to the checkpoint this one resumed from (work redone after that
  checkpoint is counted once); a checkpoint copied from another run adds nothing. `wall_s` = `wall_s_total`
  (the name older readers know)."""
  accuracy_before: float
  accuracy_after: float
  steps: int
  wall_s: float
  plot_path: str | None
  workdir: str
  wall_s_this_process: float = 0.0
  wall_s_total: float = 0.0
  # This process's seconds by part (grpo_jax/train/timing.py) and from its launch to its first finished step.
  time_split_s: dict = dataclasses.field(default_factory=dict)
  launch_to_first_step_s: float | None = None

  def line(self) -> str:
    delta = 100 * (self.accuracy_after - self.accuracy_before)
    plot = self.plot_path or "(plot disabled)"
    return (f"[done] held-out accuracy {self.accuracy_before:.3f} -> {self.accuracy_after:.3f} "
            f"({delta:+.1f} points) after {self.steps} GRPO steps in {self.wall_s:.0f}s; curves: {plot}")


def check_resumable(config, workdir: str, log) -> None:
  """A workdir with checkpoints resumes only under the settings it was started with (except those in
  `config.RESUMABLE_CHANGES`, which are printed): a changed setting is an error naming each field, raised before
  anything in the workdir is written."""
  files = RunFiles(workdir)
  if not (storage.exists(files.config) and any(name.isdigit() for name in storage.listdir(files.checkpoints))):
    return
  saved = json.loads(storage.read_text(files.config))
  conflicts, accepted = config_lib.resume_differences(saved, config)
  if conflicts:
    raise errors.ConfigError(f"workdir {workdir} holds a run started with other settings, which a resume would mix into "
                     "one history:\n  " + "\n  ".join(conflicts) + "\nUse a new --workdir for the changed "
                     "experiment, or resume with the original values.")
  for line in accepted:
    log(f"[resume] changed on resume: {line}")


class Workdir:
  """The workdir side of one run, made once and passed once: config.json, run id, the starting point, checkpoints,
  metrics.jsonl and samples (process 0 writes files; every process takes part in a checkpoint), the curves, the
  run's clock and summary.json. The loop writes the workdir through it alone.

    wd = Workdir(settings, cfg_json, path, main, log, time_split, CurvesRefresher)  # config.json written
    wd.open_history(state, fresh)                      # metrics.jsonl (TensorBoard, W&B) from the state's step on
    wd.log_step(step, metrics, rollout, bar); wd.save(run, state)
    wd.close()                                         # also when interrupted
  """

  def __init__(self, settings, cfg_json: str, path: str, main: bool, log, time_split, curves):
    """`settings`: the run's (grpo_jax/settings.py); `cfg_json`: its config as the user wrote it, in JSON (what
    config.json and each checkpoint's metadata keep); `curves`: the class that draws curves.png
    (grpo_jax/train/plotting.py's CurvesRefresher)."""
    self.settings, self.path, self.main, self.log, self.time_split = settings, path, main, log, time_split
    self.cfg_json, self.files = cfg_json, RunFiles(path)
    storage.makedirs(path)
    if main:  # config.json; and the run is unfinished: summary.json marks a finished run
      storage.remove(self.files.summary)
      storage.write_text(self.files.config, cfg_json)
    k = settings.checkpoint
    self.checkpointer = checkpoint_lib.Checkpointer(self.files.checkpoints, k.keep, k.verify, k.async_save)
    self.curves = curves(path, self.files.curves, settings.log.plot and main, log=log)
    self.writer = None
    self.saved_step: int | None = None  # the newest checkpoint this process started from or saved

  def refuse_to_overwrite_history(self) -> None:
    """No readable checkpoint: starting afresh would overwrite metrics.jsonl. Refuse when it holds GRPO steps."""
    steps = [r.get("step", 0) for r in metrics_lib.read_jsonl(self.files.metrics)]
    if any(step > 0 for step in steps):
      raise errors.WorkdirError(f"workdir {self.path} has a history of {max(steps)} GRPO steps in {self.files.metrics} "
                                f"but no readable checkpoint (see {self.files.damaged}); starting afresh would "
                                "overwrite it. Move the workdir aside or use a new --workdir.")

  def run_id(self, restored: str | None = None) -> str:
    """The run id of a checkpoint this run (its run_id file) wrote, `restored`; else a fresh one, stored there
    (process 0's is the one written) and in its checkpoints."""
    with contextlib.suppress(OSError, FileNotFoundError):
      if restored is not None and restored == storage.read_text(self.files.run_id).strip():
        return restored
    run_id = uuid.uuid4().hex
    if self.main:
      storage.write_text(self.files.run_id, run_id + "\n")
    return run_id

  def load_starting_point(self, source: str, params) -> tuple[Any, int, dict]:
    """(params, data position, step-0 evaluation) of another run's starting point (`warmstart.init_checkpoint`,
    local or on a store), or of this run's own warm start saved before a kill.

    The step-0 state is a function of the parameters (fresh optimizer state, reference = policy), so this is
    exactly the state that run started GRPO from. Its warm-start log is copied; its time is not counted here."""
    donor = RunFiles(source)
    directory = donor.starting_point()
    if directory is None:
      raise FileNotFoundError(f"config.warmstart.init_checkpoint: {source!r} holds no starting point (a run's "
                              "workdir writes it after its warm start; the step-0 checkpoint of a run without one "
                              "is rotated out once checkpoint.keep newer ones exist)")
    params, meta = checkpoint_lib.restore_params(directory, 0, checkpoint_lib.abstract_like(params))
    if self.main and storage.exists(donor.warmstart_log):
      storage.copy(donor.warmstart_log, self.files.warmstart_log)
    self.log(f"[init] parameters, data position {meta['data_position']} and step-0 evaluation from {directory}/0"
             f" (seed {meta.get('seed')})")
    return params, int(meta["data_position"]), dict(meta["initial_eval"])

  def save_starting_point(self, params, data_position: int, initial_eval: dict, warmstart_log=None) -> None:
    """The parameters GRPO starts from on their own, never rotated out like checkpoints/0 (other runs can start
    from them), after the log of the warm start that made them (its records, or None: none ran)."""
    if self.main and warmstart_log is not None:
      storage.write_text(self.files.warmstart_log, "".join(json.dumps(rec) + "\n" for rec in warmstart_log))
    meta = {"data_position": int(data_position), "initial_eval": initial_eval, "seed": int(self.settings.seed),
            "config": json.loads(self.cfg_json)}
    checkpoint_lib.save_initial_state(self.files.warmstart, params, meta, self.settings.checkpoint.verify)

  def open_history(self, state, fresh: bool) -> None:
    """The metrics writer of a run starting at `state` (a resume drops the rows logged after its step)."""
    lg = self.settings.log
    self.writer = (metrics_lib.MetricsWriter(self.path, tensorboard=lg.tensorboard,
                                             resume_step=None if fresh else state.step,
                                             wandb=metrics_lib.wandb_init_kwargs(lg, self.path, state.run_id,
                                                                                 self.cfg_json))
                   if self.main else metrics_lib.NullWriter())
    self.saved_step = None if fresh else state.step

  def elapsed_s(self, state) -> float:
    """Seconds this run (its run id) has spent up to now, over all its processes."""
    return state.wall_before + time.time() - self.time_split.t_start

  def save(self, run, state, unfinished=None) -> None:
    """Checkpoint `state.step` (asynchronous: `checkpointer.wait()` commits it); `unfinished`: run.Unfinished."""
    run.save_checkpoint(self.checkpointer, state, self.elapsed_s(state), self.cfg_json, unfinished)
    self.saved_step = state.step

  def last_eval(self, state) -> dict:
    """The held-out metrics of the newest evaluation in metrics.jsonl up to `state.step` (after a resume from it,
    records past it, from before a crash, are dropped by process 0's writer, which other processes may not have
    waited for). Every process reads the file (process 0 writes it): they all return the same summary."""
    if state.step == 0:
      return dict(state.initial_eval)
    last = state.initial_eval
    for rec in metrics_lib.read_jsonl(self.files.metrics):
      if "eval/accuracy" in rec and rec.get("step", 0) <= state.step:
        last = {k: v for k, v in rec.items() if k.startswith("eval/")}
    return last

  def log_step(self, step: int, metrics: dict, rollout, bar) -> None:
    """metrics.jsonl (every log.every steps, evaluation steps and the last), samples, the progress bar; after an
    evaluation, a fresh curves.png (the run's end draws its own)."""
    c = self.settings
    if step % c.log.every == 0 or "eval/accuracy" in metrics or step == c.num_steps:
      self.writer.write(step, metrics)
    if self.main and c.log.num_samples and (step % c.log.samples_every == 0 or step == 1):
      n = min(c.log.num_samples, len(rollout.prompts))
      idx = np.linspace(0, len(rollout.prompts) - 1, n).astype(int)
      samples = [{"prompt": rollout.prompts[i], "completion": rollout.completions[i],
                  "reward": float(rollout.rewards_B[i])} for i in idx]
      self.writer.write_samples(step, samples)
      bar.write(metrics_lib.format_samples(step, samples))
    bar.update(metrics)
    if "eval/accuracy" in metrics and step < c.num_steps and self.curves.enabled:
      self.writer.flush()  # the curves' helper draws metrics.jsonl as stored
      self.curves.after_eval()

  @contextlib.contextmanager
  def save_on_request(self, run, state, preemption):
    """Within it (a rollout keeping the main thread, which hears a signal only when XLA returns), a stop request
    wakes a thread that saves `state` at once, records the preemption and ends the process with EXIT_PREEMPTED
    once the checkpoint is committed. Leaving waits for such a save in flight: the update then donates `state`.
    `state` may also be a callable giving (the state, what its step left unfinished: run.Unfinished), called by
    the thread (the rollout overlapped with an update: the state after it, which the call waits for). With one
    process only (a save is collective), and only when `state` is not saved already."""
    if preemption.collective or (not callable(state) and self.saved_step == state.step):
      yield
      return
    wake, turn = threading.Event(), threading.Lock()  # whoever takes `turn` first: this save or the way out

    def save_and_exit():
      wake.wait()
      if not turn.acquire(blocking=False):  # the rollout ended first
        return
      nonlocal state
      try:
        state, unfinished = state() if callable(state) else (state, None)
        self.writer.flush()  # (a store's rows are written at flushes) the rows up to this step, then the step
        self.save(run, state, unfinished)
        self.checkpointer.wait()
        self._record_preemption(state, preemption.reason, preemption)
      except BaseException as e:  # pylint: disable=broad-except  (the loop's own path saves at its next safe point)
        self.log(f"[preempted] saving during the rollout failed ({type(e).__name__}: {e}); the loop saves at its "
                 "next safe point")
        return
      self.log(f"[preempted] {preemption.reason}: step {state.step} saved during the rollout of the next; "
               f"exiting {preemption.seconds_since_request():.1f} s after it with code {errors.EXIT_PREEMPTED}; "
               f"nothing was lost: the same command resumes the run from step {state.step}")
      preemption_lib.exit_preempted()

    saver = threading.Thread(target=save_and_exit, name="preemption-save", daemon=True)
    saver.start()
    preemption.notify(wake)
    try:
      yield
    finally:
      preemption.forget(wake)
      turn.acquire(blocking=False)
      wake.set()
      saver.join()  # a save in flight ends the process; a failed one returns

  def stop_preempted(self, run, state, preemption):
    """Saves the last completed step (unless it is saved), waits for the checkpoint to be committed, records the
    preemption in metrics.jsonl and raises `Preempted`."""
    self.writer.flush()
    if self.saved_step != state.step:
      self.save(run, state)
    self.checkpointer.wait()
    reason = preemption.reason or "another process was signalled"
    self._record_preemption(state, reason, preemption)
    raise errors.Preempted(reason, step=state.step)

  def _record_preemption(self, state, reason: str, preemption) -> None:
    self.writer.write_event(state.step, {"event": "preempted", "signal": reason,
                                         "seconds_to_save": round(preemption.seconds_since_request(), 3)})
    self.writer.flush()

  def finish(self, state, last_eval: dict) -> Summary:
    """The plot and summary.json of a run that reached its last step (or was stopped by a callback)."""
    plot_path = self.curves.final() if self.settings.log.plot and self.main else None
    this_process = time.time() - self.time_split.t_start
    summary = Summary(accuracy_before=state.initial_eval["eval/accuracy"], accuracy_after=last_eval["eval/accuracy"],
                      steps=state.step, wall_s=state.wall_before + this_process, plot_path=plot_path,
                      workdir=self.path, wall_s_this_process=this_process,
                      wall_s_total=state.wall_before + this_process, time_split_s=self.time_split.as_dict(),
                      launch_to_first_step_s=self.time_split.launch_to_first_step_s)
    if self.main:
      storage.write_text(self.files.summary, json.dumps(dataclasses.asdict(summary), indent=2))
    self.log(summary.line())
    self.log("[time] " + ", ".join(f"{name} {s:.1f}s" for name, s in summary.time_split_s.items()))
    return summary

  def close(self) -> None:
    """Flushes what was logged and releases the helper and orbax's threads."""
    self.curves.close()
    if self.writer is not None:
      self.writer.close()
    self.checkpointer.close()
