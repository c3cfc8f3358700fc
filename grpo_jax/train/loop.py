"""The GRPO training loop: init or restore -> rollout -> update -> log and checkpoint.

`train(config, workdir)` checks the config, builds the run's parts (grpo_jax/train/run.py), restores the latest
checkpoint in `workdir/checkpoints` if there is one (otherwise starts from a saved or fresh warm start, or from
the initial model, and evaluates it), then runs GRPO steps up to `config.num_steps`. The launcher
(grpo-train) and notebooks both call `train`.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax

from grpo_jax import compile_cache, errors, precision
from grpo_jax.data.tasks import CONSTANT_ANSWER_METRIC
from grpo_jax.persist import checkpoint as checkpoint_lib
from grpo_jax.persist import metrics as metrics_lib
from grpo_jax.persist import workdir as workdir_lib
from grpo_jax.persist.layout import committed_steps
from grpo_jax.persist.preemption import Preemption
from grpo_jax.persist.workdir import Summary
from grpo_jax.persist.workdir_lock import WorkdirLock
from grpo_jax.settings import Settings
from grpo_jax.train import checks
from grpo_jax.train import distributed
from grpo_jax.train import hooks as hooks_lib
from grpo_jax.train import inputs as inputs_lib
from grpo_jax.train.export import write_hf_model
from grpo_jax.train.inputs import RunInputs
from grpo_jax.train.plotting import CurvesRefresher
from grpo_jax.train.run import Run, RunState, Unfinished
from grpo_jax.train.timing import TimeSplit
from grpo_jax.train.warmstart import run_warmstart

def train(config, workdir: str, *, reward_funcs: Sequence[Callable] = (),
          reward_weights: Sequence[float] | None = None, train_dataset=None, eval_dataset=None,
          callbacks: Sequence[Callable] = ()) -> Summary:
  """Runs (or resumes) the experiment `config` in `workdir`. Returns the summary also printed at the end.

  The keyword arguments are for notebooks: reward callables, datasets in memory and step callbacks
  (grpo_jax/train/inputs.py); the launcher passes none.
  """
  time_split = TimeSplit()
  inputs = RunInputs(tuple(reward_funcs), reward_weights, train_dataset, eval_dataset, tuple(callbacks))
  settings = checks.validate(config, in_memory_dataset=train_dataset is not None,
                             reward_callables=[name for name, _, _ in inputs.reward_specs()])
  # SIGTERM / SIGINT from here on: stop at the next safe point with the last completed step saved (preemption.py).
  with Preemption(settings.checkpoint.preemption_deadline_s, notice=settings.checkpoint.preemption_notice
                  ) as preemption:
    config_json = config.to_json_best_effort(indent=2, sort_keys=True)  # what config.json and checkpoints keep
    precision.apply(settings.precision)  # before the backend starts: the deterministic-ops flag is read then
    distributed.initialize(settings.distributed)  # multi-host: before anything touches the devices
    compile_cache.enable(settings.compile_cache_dir)
    main = distributed.is_main()    # only process 0 writes logs, metrics, samples and plots
    log_console = print if main else (lambda *args, **kwargs: None)
    preemption.log, preemption.collective = log_console, distributed.all_true if jax.process_count() > 1 else None
    preemption.install()  # again: jax.distributed took SIGTERM for its own preemption notifier
    try:
      if main:  # the lock (a lease on a store) is the workdir's first file, before its saved config is compared
        with WorkdirLock(workdir, settings.checkpoint.lease_ttl_s, log_console):
          workdir_lib.check_resumable(config, workdir, log_console)  # the saved config.json against this one
          return _train(settings, config_json, workdir, time_split, main, log_console, inputs, preemption)
      return _train(settings, config_json, workdir, time_split, main, log_console, inputs, preemption)
    except errors.Preempted as e:
      log_console(f"[preempted] {e.reason}: exiting {preemption.seconds_since_request():.1f} s after it with code "
                  f"{errors.EXIT_PREEMPTED}; " + ("nothing was lost: " if e.step is not None else "") +
                  "the same command resumes the run" + ("" if e.step is None else f" from step {e.step}"))
      raise


def _train(settings: Settings, config_json: str, workdir: str, time_split: TimeSplit, main: bool, log_console,
           inputs: RunInputs, preemption: Preemption) -> Summary:
  wd = workdir_lib.Workdir(settings, config_json, workdir, main, log_console, time_split, CurvesRefresher)
  run = Run(settings, inputs, log_console, time_split)
  if main:  # each held-out evaluation's per-prompt rows (grpo-report reads them)
    run.evaluate.rows_path = wd.files.eval_rows
  hooks: list[hooks_lib.Hook] = []
  try:
    state = _restore(run, wd)
    inputs_lib.check_or_record(wd.files.inputs, inputs, resuming=state is not None, main=main)
    fresh = state is None
    if fresh:
      state = _start(run, wd)
    wd.open_history(state, fresh)
    with preemption.deferred():  # a signal now waits for the loop's next safe point
      if fresh:
        wd.writer.write(0, {**state.initial_eval, **hooks_lib.eval_time(run, 0)})
        wd.save(run, state)
      last_eval = wd.last_eval(state)
      _say_start(run, state, last_eval, log_console)
      bar = metrics_lib.ProgressBar(settings.num_steps, state.step, settings.log.progress_bar and main)
      bar.accuracy = last_eval["eval/accuracy"]
      hooks = hooks_lib.after_step_hooks(run, wd, bar, inputs, last_eval, state.step < settings.num_steps)
      time_split.steps_begin()
      preempted = False
      # Batch t is sampled by the policy after max(0, t - 1 - k) updates, inline (before the update, on the same
      # devices) or overlapped (the last one during the update, on the sampler's devices): the same batches.
      producer = run.producer
      if state.unfinished is not None:  # saved during the overlapped sampling, before the step's hooks ran
        u = state.unfinished
        state = state._replace(unfinished=None)
        producer.resume_behind(u.sampler_leaves, u.policy_step, state.params, state.step)
        done = hooks_lib.StepDone(state.step, state, u.rollout, _step_metrics(u.rollout, u.metrics, u.seconds))
        for hook in hooks:
          hook(done)
      else:
        producer.sync(state.params, state.step)
      producer.take_seconds()  # (the first copy belongs to the start)
      for step in range(state.step + 1, settings.num_steps + 1):
        if preempted := preemption.stop_requested():
          break
        t0 = time.perf_counter()
        with wd.save_on_request(run, state, preemption):  # a signal during the rollout saves this state at once
          # Pending through step + k (past num_steps too: a longer resumed run stays the same run).
          sampled = producer.fill(state, step)
        if preempted := preemption.stop_requested():  # drop the new rollouts: the update would donate the state
          break
        rollout, sampled = sampled.pending[0], sampled._replace(pending=sampled.pending[1:])
        during = producer.during_update(step)
        state, update_metrics = run.update(sampled, run.prepare(rollout, sampled, step), step,
                                           during and _rescued(during, wd, run, preemption, rollout, t0))
        producer.sync(state.params, step)
        update_metrics.update(producer.take_seconds())
        metrics = _step_metrics(rollout, update_metrics, time.perf_counter() - t0)
        done = hooks_lib.StepDone(step, state, rollout, metrics)
        for hook in hooks:
          hook(done)
        if done.stop:
          log_console(f"[stop] a callback ended the run after step {step} (checkpoint saved; the same call resumes "
                      "it)")
          break
      if preempted or preemption.reason is not None:  # (a signal during the last step: that step is saved)
        wd.stop_preempted(run, state, preemption)
      time_split.steps_end()
      last_eval = next(h.last for h in hooks if isinstance(h, hooks_lib.Evaluate))
    if settings.checkpoint.export_hf:  # a signal here stops at once: the last step is saved
      write_hf_model(run.policy.graphdef, state.params, settings.model.hf_path, run.tokenizer, wd.files.hf_model,
                     log=log_console)
  finally:  # also when interrupted: flush what was logged, release the helper's and orbax's threads.
    for hook in hooks:
      hook.close()
    wd.close()
  with preemption.deferred():  # the run is complete: a signal now lets the summary be written
    return wd.finish(state, last_eval)


def _say_start(run: Run, state: RunState, last_eval: dict, log) -> None:
  s, g = run.settings, run.settings.grpo
  constant = state.initial_eval.get(CONSTANT_ANSWER_METRIC)
  log(f"[start] step {state.step}/{s.num_steps}, held-out accuracy {last_eval['eval/accuracy']:.3f}"
      + ("" if constant is None else f" (one constant answer would score {constant:.3f})") + ";"
      f" rollout batch {g.prompts_per_step} prompts x G={g.group_size}, {s.updates_per_step} update(s)/step")
  if state.step < s.num_steps:
    log(f"[step {state.step + 1}] compiling and running the first step (persistent compilation cache: "
        f"{jax.config.jax_compilation_cache_dir or 'off'}) ...")


def _restore(run: Run, wd: Workdir) -> RunState | None:
  """The run state of the latest readable checkpoint in the workdir, or None (refusing to start afresh over a
  run's history)."""
  settings, log = run.settings, wd.log
  restored = None
  if wd.checkpointer.all_steps():
    template = run.new_state(run.initial_params, 0, 0, {}, "")
    # The abstract target carries the shardings of this run's mesh: a checkpoint restores onto any mesh.
    restored = wd.checkpointer.restore_latest(checkpoint_lib.abstract_like(run.checkpoint_arrays(template)))
  if restored is None:
    wd.refuse_to_overwrite_history()
    return None
  meta = restored.meta
  if meta.get("seed") != settings.seed:
    raise errors.ConfigError(f"workdir {wd.path} holds a run with seed {meta.get('seed')}, not config.seed="
                             f"{settings.seed}; use another workdir")
  run_id = wd.run_id(meta.get("run_id"))
  own = run_id == meta.get("run_id")
  if not own:
    log(f"[resume] the checkpoint was written by another run (run id {meta.get('run_id')}): its time is not "
        "counted in wall_s_total")
  params, ref_state = run.policy.from_checkpoint(restored.state, meta, wd.files.warmstart)
  log(f"[resume] restored step {restored.step} from {wd.checkpointer.directory}")
  pending, unfinished = run.restored_pending(restored.pending, meta)
  return RunState(params, restored.state["opt_state"], ref_state, restored.step, int(meta["data_position"]),
                  meta["initial_eval"], run_id, float(meta.get("elapsed_s", 0.0)) if own else 0.0, pending,
                  unfinished)


def _start(run: Run, wd: Workdir) -> RunState:
  """The starting point of a new run: another run's (warmstart.init_checkpoint), this run's own saved warm
  start (a kill after it was saved), a fresh warm start, or the initial model; with its held-out metrics."""
  settings, log = run.settings, wd.log
  run_id = wd.run_id()
  # The starting point is a base model (with LoRA, the adapters are added after it: a warm start trains all
  # the base's weights, and the reference is the base it produced), saved like a full fine-tuning run's.
  policy = run.policy
  params, data_position, history = policy.base_part(run.initial_params), 0, None
  own_start = wd.files.warmstart
  start_saved = 0 in committed_steps(own_start)  # a kill after the warm-start save, before checkpoint 0
  source = settings.warmstart.init_checkpoint or (own_start if settings.warmstart.enabled and start_saved else "")
  if source:  # another run's starting point, or this run's saved warm start (bit for bit the same)
    params, data_position, initial_eval = wd.load_starting_point(source, params)
  elif settings.warmstart.enabled:
    s = settings.sampling
    params, info = run_warmstart(
        settings.warmstart, task=run.task, tokenizer=run.tokenizer, graphdef=policy.base_graphdef, params=params,
        max_prompt_length=s.max_prompt_length, max_new_tokens=run.settings.completion_width,
        chunk_size=settings.model.logprob_chunk_size, evaluate=lambda p: run.evaluate(policy.from_base(p), 0),
        log=log, mesh=run.mesh)
    data_position, initial_eval, history = info["rows"], info["eval"], info["history"]
  else:
    initial_eval = run.evaluate(policy.from_base(params), 0)
  if (settings.warmstart.enabled or settings.warmstart.init_checkpoint) and not start_saved:
    wd.save_starting_point(params, data_position, initial_eval, history)
  return run.new_state(policy.from_base(params), 0, data_position, initial_eval, run_id)


def _rescued(during: Callable, wd, run: Run, preemption: Preemption, rollout, t0: float) -> Callable:
  """Run.update's `meanwhile`: the overlapped sampling `during(state)`, in which a signal saves the state after
  the update at once, its step unfinished (its hooks run when the run resumes), with the sampler's policy for the
  batch it was sampling."""
  def meanwhile(before: RunState, updated: Callable) -> RunState:
    def after_update():
      state, metrics = updated()
      return state, Unfinished(rollout, metrics, time.perf_counter() - t0, run.producer.sampler_leaves(),
                               run.producer.params_step)
    with wd.save_on_request(run, after_update, preemption):
      return during(before)
  return meanwhile


def _step_metrics(rollout, step_metrics: dict, step_time: float) -> dict[str, Any]:
  metrics: dict[str, Any] = {**distributed.merge_metrics(rollout.metrics),
                             **{k: float(v) for k, v in step_metrics.items()},
                             "step_time": step_time, "tokens_per_s": rollout.num_tokens / step_time}
  # What the timed phases (sampling, rewards, reference, update) leave: data, tokenizing, placement, logging.
  metrics["timing/other_s"] = step_time - sum(v for k, v in metrics.items() if k.startswith("timing/"))
  return metrics
