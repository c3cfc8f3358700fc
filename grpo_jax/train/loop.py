"""The GRPO training loop: config -> data -> sampler -> rewards -> advantages -> update -> metrics/checkpoints.

`train(config, workdir)` validates the config, builds the task, tokenizer and model, restores the latest
checkpoint in `workdir/checkpoints` if there is one (otherwise runs the optional supervised warm start and
the step-0 evaluation), then runs GRPO steps up to `config.num_steps`. Every array program is compiled a
fixed number of times per run: the update and the reference log-probs once, the sampler once per
(batch, prompt-length) bucket, which the fixed prompt padding makes one per sampler.

Randomness: the key of step s is fold_in(key(seed), s) (sampling) and the data of step s are the training
rows [position, position + prompts_per_step); a checkpoint stores both, so a resumed run continues exactly.
With DAPO dynamic sampling (`grpo.dynamic_sampling`) a step may sample several such blocks of rows (round r
with fold_in(step key, r)); the position counts every row consumed, so resume stays exact.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax import compile_cache
from grpo_jax import config as config_lib
from grpo_jax import precision
from grpo_jax.algo.objective import LossConfig
from grpo_jax.data.tasks import make_task, stop_ids
from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.model import sharding as sharding_lib
from grpo_jax.rewards import gate_on_format, get_reward, make_overlong_reward
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.train import distributed
from grpo_jax.train import metrics as metrics_lib
from grpo_jax.train.checkpoint import CHECKPOINT_DIR, Checkpointer, restore_params, save_initial_state
from grpo_jax.train.evaluation import evaluate
from grpo_jax.train import inputs as inputs_lib
from grpo_jax.train.export import EXPORT_DIR, write_hf_model
from grpo_jax.train.inputs import RunInputs
from grpo_jax.train.offload import RefOffloader
from grpo_jax.train.optim import learning_rate_schedule, make_optimizer
from grpo_jax.train.rollout import RolloutSettings, collect_dynamic_rollout, collect_rollout, trim_padding
from grpo_jax.train.state import init_opt_state
from grpo_jax.train.step import RolloutBatch, make_logprob_fn, make_train_step
from grpo_jax.train.warmstart import run_warmstart

logger = logging.getLogger(__name__)

WARMSTART_DIR = "warmstart"  # the parameters GRPO started from (after the warm start); never garbage-collected
PLOT_FILE = "curves.png"
SUMMARY_FILE = "summary.json"
MAX_NONFINITE_STEPS = 3  # consecutive steps of skipped (non-finite) updates that stop a run


# ---- building blocks ------------------------------------------------------------------------------------

def build_tokenizer_and_task(config, log=print, inputs: RunInputs = RunInputs()):
  """log: where the task's one-line data report goes (the main process's console on multi-host runs)."""
  # grpo_jax/data/tasks.py; the tokenizer is the checkpoint's with hf_path.
  task = make_task(config, log=log, train_rows=inputs.train_dataset, heldout_rows=inputs.eval_dataset)
  return task.tokenizer, task


def build_model(config, tokenizer, mesh):
  """(graphdef, params) with params placed on `mesh` by their logical-axis shardings."""
  m = config.model
  if m.hf_path:
    from grpo_jax.model import hf_io
    model = hf_io.from_pretrained(m.hf_path, param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat,
                                  mesh=mesh)
    config_lib.check_context(config, model.cfg.max_position_embeddings,
                             f"max_position_embeddings of {m.hf_path}/config.json")
    return nnx.split(model)
  vocab = m.vocab_size or tokenizer.vocab_size
  if vocab < tokenizer.vocab_size:
    raise ValueError(f"config.model.vocab_size: {vocab} is smaller than the tokenizer's {tokenizer.vocab_size}")
  cfg = ModelConfig(vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                    num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                    head_dim=m.head_dim, max_position_embeddings=m.max_position_embeddings,
                    rope_theta=m.rope_theta, rms_norm_eps=m.rms_norm_eps,
                    tie_word_embeddings=m.tie_word_embeddings, param_dtype=m.param_dtype, dtype=m.dtype,
                    remat=m.remat)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  shardings = sharding_lib.param_shardings(abstract, mesh)
  # One compiled initializer (initializing eagerly compiles one small program per parameter).
  init = jax.jit(lambda key: nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=key)))[1], out_shardings=shardings)
  return graphdef, init(jax.random.fold_in(jax.random.key(config.seed), 0))


def build_reward_fns(config, inputs: RunInputs = RunInputs()):
  gates = config.reward_gates  # name -> format reward: the named reward counts only where the format is right.
  fns = [(name, gate_on_format(name, gates[name]) if name in gates else get_reward(name), float(weight))
         for name, weight in config_lib.configured_rewards(config).items()]
  clash = {name for name, _, _ in fns} & {name for name, _, _ in inputs.reward_specs()}
  if clash:
    raise ValueError(f"reward_funcs: {sorted(clash)} is also a reward of the config; rename the callable")
  fns += inputs.reward_specs()
  g = config.grpo
  if g.overlong_buffer > 0:
    fns.append(("overlong_penalty", make_overlong_reward(config.sampling.max_new_tokens, g.overlong_buffer,
                                                         g.overlong_penalty_factor), 1.0))
  return fns


def loss_config(config) -> LossConfig:
  g = config.grpo
  return LossConfig(policy_loss=g.policy_loss, epsilon_low=g.epsilon_low, epsilon_high=g.epsilon_high,
                    delta=g.delta, importance_level=g.importance_level, cispo_epsilon_high=g.cispo_epsilon_high,
                    kl_estimator=g.kl_estimator, beta=g.beta, entropy_coef=g.entropy_coef,
                    top_entropy_quantile=g.top_entropy_quantile, aggregation=g.aggregation,
                    max_completion_length=config.sampling.max_new_tokens, tis_cap=g.tis_cap or None)


def make_samplers(graphdef, config, tokenizer):
  """(training sampler, greedy evaluation sampler, pass@k sampler or None)."""
  s = config.sampling
  common = dict(max_new_tokens=s.max_new_tokens, stop_ids=stop_ids(tokenizer),
                pad_id=tokenizer.pad_token_id)
  # Prompts are padded to exactly max_prompt_length: one prompt shape per run.
  buckets = dict(prompt_bucket_min=s.max_prompt_length, prompt_bucket_step=s.max_prompt_length)
  train = Sampler(graphdef, SamplingConfig(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, **common),
                  **buckets)
  greedy = Sampler(graphdef, SamplingConfig(temperature=s.temperature, greedy=True, **common), **buckets)
  pass_k = None
  if config.eval.pass_k > 0:
    pass_k = Sampler(graphdef, SamplingConfig(temperature=config.eval.pass_k_temperature, **common), **buckets)
  return train, greedy, pass_k


class _BatchPlacer:
  """Puts rollout arrays on the mesh, split along 'data'/'fsdp' when the batch divides evenly."""

  def __init__(self, mesh):
    self.mesh = mesh
    self.ways = mesh.shape["data"] * mesh.shape["fsdp"]

  def __call__(self, batch: RolloutBatch) -> RolloutBatch:
    if jax.process_count() > 1:  # each process holds its own rows: assemble the global arrays
      return distributed.put_batch(batch, self.mesh)

    def put(x):
      if x is None:
        return None
      spec = PartitionSpec(("data", "fsdp")) if x.shape[0] % self.ways == 0 else PartitionSpec()
      return jax.device_put(x, NamedSharding(self.mesh, spec))
    return RolloutBatch(*[put(x) for x in batch])


# ---- the run --------------------------------------------------------------------------------------------

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

  def line(self) -> str:
    delta = 100 * (self.accuracy_after - self.accuracy_before)
    plot = self.plot_path or "(plot disabled)"
    return (f"[done] held-out accuracy {self.accuracy_before:.3f} -> {self.accuracy_after:.3f} "
            f"({delta:+.1f} points) after {self.steps} GRPO steps in {self.wall_s:.0f}s; curves: {plot}")


def train(config, workdir: str, *, reward_funcs: Sequence[Callable] = (),
          reward_weights: Sequence[float] | None = None, train_dataset=None, eval_dataset=None,
          callbacks: Sequence[Callable] = ()) -> Summary:
  """Runs (or resumes) the experiment `config` in `workdir`. Returns the summary also printed at the end.

  The keyword arguments are for notebooks: reward callables, datasets in memory and step callbacks
  (grpo_jax/train/inputs.py); the launcher passes none.
  """
  t_start = time.time()
  inputs = RunInputs(tuple(reward_funcs), reward_weights, train_dataset, eval_dataset, tuple(callbacks))
  config_lib.validate(config, in_memory_dataset=train_dataset is not None,
                      reward_callables=[name for name, _, _ in inputs.reward_specs()])
  precision.apply(config)         # before the backend starts: the deterministic-ops flag is read then
  distributed.initialize(config)  # multi-host: before anything touches the devices
  compile_cache.enable(config.compile_cache_dir)
  main = distributed.is_main()    # only process 0 writes logs, metrics, samples and plots
  log_console = print if main else (lambda *args, **kwargs: None)
  if main:  # the lock file is the only thing written before the settings are checked
    with WorkdirLock(workdir):
      _check_resumable(config, workdir, log_console)
      return _train(config, workdir, t_start, main, log_console, inputs)
  return _train(config, workdir, t_start, main, log_console, inputs)


def _train(config, workdir: str, t_start: float, main: bool, log_console, inputs: RunInputs) -> Summary:
  os.makedirs(workdir, exist_ok=True)
  # The summary marks a finished run; this one is not yet.
  if main and os.path.exists(os.path.join(workdir, SUMMARY_FILE)):
    os.remove(os.path.join(workdir, SUMMARY_FILE))
  cfg_json = config.to_json_best_effort(indent=2, sort_keys=True)
  if main:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(cfg_json)

  tokenizer, task = build_tokenizer_and_task(config, log=log_console, inputs=inputs)
  mesh = sharding_lib.make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
  graphdef, params = build_model(config, tokenizer, mesh)
  place = _BatchPlacer(mesh)

  g, s = config.grpo, config.sampling
  B = config_lib.rollout_batch_size(config)
  mini = config_lib.mini_batch_size(config)
  micro = config_lib.micro_batch_size(config)
  updates_per_step = g.num_iterations * (B // mini)
  schedule = learning_rate_schedule(config.optim, config.num_steps, updates_per_step)
  optimizer = make_optimizer(config.optim, schedule)
  # Fixed shardings in and out, so the donated outputs feed the next call without a recompile.
  param_sh = jax.tree.map(lambda x: x.sharding, params)
  opt_state, opt_sh = init_opt_state(optimizer, params, mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  copy_params = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=param_sh)
  use_ref = g.beta > 0
  offloader = RefOffloader(config.model.offload_ref_params, mesh)  # host memory between uses, if asked
  ref_params = offloader.park(copy_params(params)) if use_ref else None

  train_step = jax.jit(make_train_step(
      graphdef, optimizer, loss_config(config), num_iterations=g.num_iterations, mini_batch_size=mini,
      micro_batch_size=micro, temperature=s.temperature, chunk_size=config.model.logprob_chunk_size),
      donate_argnums=(0, 1), out_shardings=(param_sh, opt_sh, replicated))
  ref_logprobs = jax.jit(make_logprob_fn(graphdef, temperature=s.temperature,
                                         chunk_size=config.model.logprob_chunk_size, micro_batch_size=micro))
  sampler, greedy_sampler, pass_k_sampler = make_samplers(graphdef, config, tokenizer)
  reward_fns = build_reward_fns(config, inputs)
  settings = RolloutSettings.from_config(config, reward_fns)
  eval_columns = task.eval_rows(config.eval.size)
  base_key = jax.random.key(config.seed)

  transfer_columns = {name: task.transfer_rows(name, config.eval.size)
                      for name in getattr(task, "transfer_sets", ())}

  def run_eval(p, step):
    """Held-out metrics eval/*; at the first and last step also transfer/<name>/* for each transfer set."""
    kwargs = dict(accuracy_reward=config.eval.accuracy_reward, max_prompt_length=s.max_prompt_length,
                  batch_size=min(config.eval.batch_size, config.eval.size),
                  key=jax.random.fold_in(base_key, 10_000_000 + step))
    metrics = evaluate(greedy_sampler, p, tokenizer, eval_columns, settings.scoring, pass_k=config.eval.pass_k,
                       pass_k_sampler=pass_k_sampler, **kwargs)
    if step in (0, config.num_steps):
      for name, columns in transfer_columns.items():
        transfer = evaluate(greedy_sampler, p, tokenizer, columns, settings.scoring, **kwargs)
        metrics.update({f"transfer/{name}/" + k.split("/", 1)[1]: v for k, v in transfer.items()})
    return metrics

  def state_tree():
    tree = {"params": params, "opt_state": opt_state}
    if use_ref:
      tree["ref_params"] = ref_params
    return tree

  checkpointer = Checkpointer(os.path.join(workdir, CHECKPOINT_DIR), config.checkpoint.keep,
                              config.checkpoint.verify)
  writer = bar = None
  try:
    restored = None
    if checkpointer.all_steps():
      # The abstract target carries the shardings of this run's mesh: a checkpoint restores onto any mesh.
      abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state_tree())
      restored = checkpointer.restore_latest(abstract)
    if restored is None:
      _refuse_to_overwrite_history(workdir)
    inputs_lib.check_or_record(workdir, inputs, resuming=restored is not None, main=main)
    if restored is not None:
      params, opt_state = restored.state["params"], restored.state["opt_state"]
      if use_ref:
        ref_params = restored.state["ref_params"]
      start_step = restored.step
      meta = restored.meta
      data_position = int(meta["data_position"])
      initial_eval = meta["initial_eval"]
      # Legacy checkpoints (no run id) count as this run's.
      own = meta.get("run_id") in (None, _read_run_id(workdir))
      wall_before = float(meta.get("elapsed_s", 0.0)) if own else 0.0
      run_id = meta.get("run_id") if own else _new_run_id(workdir, main)
      if not own:
        log_console(f"[resume] the checkpoint was written by another run (run id {meta.get('run_id')}): its "
                    "time is not counted in wall_s_total")
      if meta.get("seed") != config.seed:
        raise ValueError(f"workdir {workdir} holds a run with seed {meta.get('seed')}, not config.seed="
                         f"{config.seed}; use another workdir")
      log_console(f"[resume] restored step {start_step} from {checkpointer.directory}")
      writer = (metrics_lib.MetricsWriter(workdir, tensorboard=config.log.tensorboard, resume_step=start_step,
                                          wandb=_wandb_init(config, workdir, run_id, cfg_json))
                if main else distributed.NullWriter())
    else:
      start_step = 0
      wall_before = 0.0
      run_id = _new_run_id(workdir, main)
      writer = (metrics_lib.MetricsWriter(workdir, tensorboard=config.log.tensorboard,
                                          wandb=_wandb_init(config, workdir, run_id, cfg_json)) if main
                else distributed.NullWriter())
      data_position = 0
      own_start = os.path.join(workdir, WARMSTART_DIR)
      start_saved = _has_initial_state(own_start)  # a kill after the warm-start save, before checkpoint 0
      source = config.warmstart.init_checkpoint or (own_start if config.warmstart.enabled and start_saved else "")
      if source:  # another run's starting point, or this run's saved warm start (bit for bit the same)
        params, data_position, initial_eval = _load_initial_state(source, params, workdir, main, log_console)
        opt_state, _ = init_opt_state(optimizer, params, mesh)
        if use_ref:
          ref_params = offloader.park(copy_params(params))
      elif config.warmstart.enabled:
        params, info = run_warmstart(
            config.warmstart, task=task, tokenizer=tokenizer, graphdef=graphdef, params=params,
            max_prompt_length=s.max_prompt_length, max_new_tokens=s.max_new_tokens,
            chunk_size=config.model.logprob_chunk_size, evaluate=lambda p: run_eval(p, 0), log=log_console,
            mesh=mesh)
        if main:
          with open(os.path.join(workdir, metrics_lib.WARMSTART_FILE), "w") as f:
            for rec in info["history"]:
              f.write(json.dumps(rec) + "\n")
        data_position = info["rows"]
        initial_eval = info["eval"]
        opt_state, _ = init_opt_state(optimizer, params, mesh)
        if use_ref:
          ref_params = offloader.park(copy_params(params))
      else:
        initial_eval = run_eval(params, 0)
      if (config.warmstart.enabled or config.warmstart.init_checkpoint) and not start_saved:
        # The starting point on its own, never rotated out like checkpoints/0: other runs can start from it.
        save_initial_state(own_start, params,
                           {"data_position": int(data_position), "initial_eval": initial_eval,
                            "seed": int(config.seed), "config": json.loads(cfg_json)}, config.checkpoint.verify)
      writer.write(0, initial_eval)
      checkpointer.save(0, state_tree(), _meta(config, 0, data_position, initial_eval, time.time() - t_start,
                                               cfg_json, run_id))

    last_eval = dict(initial_eval) if start_step == 0 else _last_eval(writer.metrics_path, initial_eval)
    log_console(f"[start] step {start_step}/{config.num_steps}, held-out accuracy {last_eval['eval/accuracy']:.3f}; "
                f"rollout batch {g.prompts_per_step} prompts x G={g.group_size}, {updates_per_step} update(s)/step")
    bar = metrics_lib.ProgressBar(config.num_steps, start_step, config.log.progress_bar and main)
    # Multi-host: this process loads prompts [offset, offset + count) of each step's rollout batch.
    offset, count = ((0, g.prompts_per_step) if jax.process_count() == 1 else
                     distributed.local_prompt_slice(mesh, g.prompts_per_step, g.group_size))
    bar.accuracy = last_eval["eval/accuracy"]

    def next_columns():
      """This process's prompts of the next prompts_per_step training rows; advances the data position."""
      nonlocal data_position
      columns = task.train_rows(data_position + offset, count)
      data_position += g.prompts_per_step
      return columns

    global_sampler = distributed.GlobalSampler(sampler, offset * g.group_size)

    nonfinite_steps = 0  # consecutive steps whose every update was skipped
    last_step = start_step
    for step in range(start_step + 1, config.num_steps + 1):
      t0 = time.time()
      step_key = jax.random.fold_in(base_key, step)
      if g.dynamic_sampling:  # DAPO: more prompts until the batch has prompts_per_step groups with signal
        rollout = collect_dynamic_rollout(global_sampler, params, tokenizer, next_columns, settings, step_key,
                                          max_rounds=g.dynamic_sampling_max_rounds, all_done=distributed.all_true)
      else:
        rollout = collect_rollout(global_sampler, params, tokenizer, next_columns(), settings, step_key)
      # One process: cut padding to a bucket width (multi-host processes would each cut differently).
      batch = place(trim_padding(rollout.batch, g.length_buckets) if jax.process_count() == 1 else rollout.batch)
      if use_ref:
        batch = batch._replace(ref_logp_BxC=ref_logprobs(offloader.fetch(ref_params), batch))
      params, opt_state, step_metrics = train_step(params, opt_state, batch)
      step_metrics = jax.device_get(step_metrics)
      nonfinite_steps = nonfinite_steps + 1 if step_metrics["skipped_updates"] == updates_per_step else 0
      if nonfinite_steps >= MAX_NONFINITE_STEPS:
        raise FloatingPointError(
            f"steps {step - nonfinite_steps + 1}..{step}: every update had a non-finite loss, gradient or result "
            f"and was skipped (grad_norm {float(step_metrics['grad_norm'])}); the last checkpoint holds finite "
            f"parameters. Likely causes: a learning rate too high (optim.learning_rate={config.optim.learning_rate}"
            f"), float16 overflow (model.dtype={config.model.dtype}), or a reward of NaN/inf.")
      if use_ref and g.ref_reset_every and step % g.ref_reset_every == 0:
        # iterative GRPO: the reference becomes the current policy.
        ref_params = offloader.park(copy_params(params))
      step_time = time.time() - t0

      metrics: dict[str, Any] = distributed.merge_metrics(rollout.metrics)
      metrics.update({k: float(v) for k, v in step_metrics.items()})
      metrics["learning_rate"] = float(schedule((step - 1) * updates_per_step))
      metrics["step_time"] = step_time
      metrics["tokens_per_s"] = rollout.num_tokens / step_time
      if step % config.eval.every == 0 or step == config.num_steps:
        last_eval = run_eval(params, step)
        metrics.update(last_eval)
      if step % config.log.every == 0 or "eval/accuracy" in metrics or step == config.num_steps:
        writer.write(step, metrics)
      if main and config.log.num_samples and (step % config.log.samples_every == 0 or step == 1):
        n = min(config.log.num_samples, len(rollout.prompts))
        idx = np.linspace(0, len(rollout.prompts) - 1, n).astype(int)
        samples = [{"prompt": rollout.prompts[i], "completion": rollout.completions[i],
                    "reward": float(rollout.rewards_B[i])} for i in idx]
        writer.write_samples(step, samples)
        bar.write(metrics_lib.format_samples(step, samples))
      bar.update(metrics)
      stop = any([bool(callback(step, dict(metrics))) for callback in inputs.callbacks])  # every one is called
      if step % config.checkpoint.every == 0 or step == config.num_steps or stop:
        writer.flush()
        checkpointer.save(step, state_tree(), _meta(config, step, data_position, initial_eval,
                                                    wall_before + time.time() - t_start, cfg_json, run_id))
      last_step = step
      if stop:
        log_console(f"[stop] a callback ended the run after step {step} (checkpoint saved; the same call resumes it)")
        break
    if config.checkpoint.export_hf:
      write_hf_model(graphdef, params, config, tokenizer, os.path.join(workdir, EXPORT_DIR), log=log_console)
  finally:  # also when interrupted: flush what was logged, release orbax's threads.
    if bar is not None:
      bar.close()
    if writer is not None:
      writer.close()
    checkpointer.close()

  plot_path = None
  if config.log.plot and main:
    from grpo_jax.train.plotting import plot_runs
    plot_path = plot_runs([workdir], os.path.join(workdir, PLOT_FILE))
  this_process = time.time() - t_start
  summary = Summary(accuracy_before=initial_eval["eval/accuracy"], accuracy_after=last_eval["eval/accuracy"],
                    steps=last_step, wall_s=wall_before + this_process, plot_path=plot_path,
                    workdir=workdir, wall_s_this_process=this_process, wall_s_total=wall_before + this_process)
  if main:
    with open(os.path.join(workdir, SUMMARY_FILE), "w") as f:
      json.dump(dataclasses.asdict(summary), f, indent=2)
  log_console(summary.line())
  return summary


def _check_resumable(config, workdir: str, log) -> None:
  """A workdir with checkpoints resumes only under the settings it was started with (except those in
  `config.RESUMABLE_CHANGES`, which are printed): a changed setting is an error naming each field, raised before
  anything in the workdir is written."""
  saved_path = os.path.join(workdir, "config.json")
  checkpoints = os.path.join(workdir, CHECKPOINT_DIR)
  if not (os.path.exists(saved_path) and os.path.isdir(checkpoints)
          and any(name.isdigit() for name in os.listdir(checkpoints))):
    return
  with open(saved_path) as f:
    saved = json.load(f)
  conflicts, accepted = config_lib.resume_differences(saved, config)
  if conflicts:
    raise ValueError(f"workdir {workdir} holds a run started with other settings, which a resume would mix into "
                     "one history:\n  " + "\n  ".join(conflicts) + "\nUse a new --workdir for the changed "
                     "experiment, or resume with the original values.")
  for line in accepted:
    log(f"[resume] changed on resume: {line}")


def _refuse_to_overwrite_history(workdir: str) -> None:
  """No readable checkpoint: starting afresh would overwrite metrics.jsonl. Refuse when it holds GRPO steps."""
  path = os.path.join(workdir, metrics_lib.METRICS_FILE)
  steps = [r.get("step", 0) for r in metrics_lib.read_jsonl(path)] if os.path.exists(path) else []
  if any(step > 0 for step in steps):
    damaged = os.path.join(workdir, CHECKPOINT_DIR + "_damaged")
    raise RuntimeError(f"workdir {workdir} has a history of {max(steps)} GRPO steps in {path} but no readable "
                       f"checkpoint (see {damaged}); starting afresh would overwrite it. Move the workdir aside "
                       "or use a new --workdir.")


class WorkdirLock:
  """One run per workdir: an exclusive `flock` on WORKDIR/.lock, held while the run lives. The kernel drops it
  when the process dies, however it dies, so a stale lock never blocks a resume."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, ".lock")
    self._file = None

  def __enter__(self):
    import fcntl
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    self._file = open(self.path, "a+")
    try:
      fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self._file.seek(0)
      holder = self._file.read().strip() or "another process"
      self._file.close()
      raise RuntimeError(f"workdir {os.path.dirname(self.path)} is in use by {holder}; wait for it to finish or "
                         "use another --workdir") from None
    self._file.seek(0)
    self._file.truncate()
    self._file.write(f"process {os.getpid()} on {os.uname().nodename}\n")
    self._file.flush()
    return self

  def __exit__(self, *exc):
    self._file.close()  # releases the lock


def _initial_state_dir(source: str) -> tuple[str, int]:
  """(orbax directory, step) of the starting point in `source`: a run's workdir (its warmstart/ directory,
  else its step-0 checkpoint) or a warmstart/ or checkpoints/ directory itself."""
  candidates = [(os.path.join(source, WARMSTART_DIR), 0), (os.path.join(source, CHECKPOINT_DIR), 0), (source, 0)]
  for directory, step in candidates:
    if os.path.exists(os.path.join(directory, str(step), "commit_success.txt")) or (
        os.path.isdir(os.path.join(directory, str(step), "state")) and
        os.path.isdir(os.path.join(directory, str(step), "meta"))):
      return directory, step
  raise FileNotFoundError(f"config.warmstart.init_checkpoint: {source!r} holds no starting point (expected "
                          f"{WARMSTART_DIR}/0 or {CHECKPOINT_DIR}/0 of a run's workdir, written after its warm "
                          "start; the step-0 checkpoint is rotated out once checkpoint.keep newer ones exist)")


def _has_initial_state(directory: str) -> bool:
  try:
    _initial_state_dir(directory)
    return True
  except FileNotFoundError:
    return False


def _load_initial_state(source: str, params, workdir: str, main: bool, log) -> tuple[Any, int, dict]:
  """(params, data position, step-0 evaluation) of another run's starting point (`warmstart.init_checkpoint`),
  or of this run's own warm start saved before a kill.

  The step-0 state is a function of the parameters (fresh optimizer state, reference = policy), so this is
  exactly the state that run started GRPO from. Its warm-start log is copied; its time is not counted here."""
  directory, step = _initial_state_dir(source)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
  params, meta = restore_params(directory, step, abstract)
  warmstart_log = os.path.join(source, metrics_lib.WARMSTART_FILE)
  if main and os.path.exists(warmstart_log):
    shutil.copy(warmstart_log, os.path.join(workdir, metrics_lib.WARMSTART_FILE))
  log(f"[init] parameters, data position {meta['data_position']} and step-0 evaluation from {directory}/{step}"
      f" (seed {meta.get('seed')})")
  return params, int(meta["data_position"]), dict(meta["initial_eval"])


RUN_ID_FILE = "run_id"


def _wandb_init(config, workdir: str, run_id: str, cfg_json: str) -> dict | None:
  """`wandb.init` keyword arguments of the run (config.log.wandb*), or None when W&B logging is off."""
  lg = config.log
  if not lg.wandb:
    return None
  return dict(project=lg.wandb_project, entity=lg.wandb_entity or None, mode=lg.wandb_mode,
              name=lg.wandb_name or os.path.basename(os.path.normpath(workdir)), id=run_id,
              config=json.loads(cfg_json))


def _read_run_id(workdir: str) -> str | None:
  try:
    with open(os.path.join(workdir, RUN_ID_FILE)) as f:
      return f.read().strip()
  except OSError:
    return None


def _new_run_id(workdir: str, main: bool) -> str:
  """A fresh id for the run in `workdir`, stored there and in its checkpoints (process 0's is the one written)."""
  run_id = uuid.uuid4().hex
  if main:
    with open(os.path.join(workdir, RUN_ID_FILE), "w") as f:
      f.write(run_id + "\n")
  return run_id


def _meta(config, step, data_position, initial_eval, elapsed_s, cfg_json, run_id) -> dict:
  """elapsed_s: seconds this run (run_id) has spent up to this checkpoint, over all its processes."""
  key_data = jax.random.key_data(jax.random.key(config.seed))
  return {"step": int(step), "run_id": run_id, "data_position": int(data_position), "seed": int(config.seed),
          "rng_key_data": np.asarray(key_data).tolist(), "initial_eval": initial_eval,
          "elapsed_s": float(elapsed_s), "config": json.loads(cfg_json)}


def _last_eval(metrics_path: str, default: dict) -> dict:
  """The most recent evaluation in metrics.jsonl (after a resume)."""
  last = default
  for rec in metrics_lib.read_jsonl(metrics_path):
    if "eval/accuracy" in rec:
      last = {k: v for k, v in rec.items() if k.startswith("eval/")}
  return last
