"""The GRPO training loop: config -> data -> sampler -> rewards -> advantages -> update -> metrics/checkpoints.

`train(config, workdir)` validates the config, builds the task, tokenizer and model, restores the latest
checkpoint in `workdir/checkpoints` if there is one (otherwise runs the optional supervised warm start and
the step-0 evaluation), then runs GRPO steps up to `config.num_steps`. Every array program is compiled a
bounded number of times per run: the sampler, the reference log-probs and the update once per width of the
prompts and completions they see, of at most `grpo.length_buckets` widths each.

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
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax import compile_cache, errors
from grpo_jax import config as config_lib
from grpo_jax import precision
from grpo_jax.algo.objective import LossConfig
from grpo_jax.data.reasoning_gym import closing_tag_ids
from grpo_jax.data.tasks import make_task, stop_ids
from grpo_jax.envs import env_factory, stop_token_ids
from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.model import lora as lora_lib
from grpo_jax.model import sharding as sharding_lib
from grpo_jax.rewards import gate_on_format, get_reward, make_overlong_reward
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.sampling.episodes import EpisodeSampler
from grpo_jax.train import distributed
from grpo_jax.train import metrics as metrics_lib
from grpo_jax.train import checkpoint as checkpoint_lib
from grpo_jax.train.checkpoint import (CHECKPOINT_DIR, WARMSTART_DIR, Checkpointer, restore_params,
                                       save_initial_state)
from grpo_jax.train.evaluation import evaluate
from grpo_jax.train import inputs as inputs_lib
from grpo_jax.train.export import EXPORT_DIR, write_hf_model
from grpo_jax.train.inputs import RunInputs
from grpo_jax.train.offload import RefOffloader
from grpo_jax.train.optim import OptimConfig, learning_rate_schedule, make_optimizer
from grpo_jax.train.rollout import (RolloutSettings, bucket_widths, collect_dynamic_rollout, collect_rollout,
                                    trim_padding)
from grpo_jax.train.state import init_opt_state, opt_state_shardings
from grpo_jax.train.step import RolloutBatch, check_prompt_runs, make_logprob_fn, make_train_step
from grpo_jax.train.warmstart import run_warmstart

logger = logging.getLogger(__name__)

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
  """(graphdef, params) with params placed on `mesh` by their logical-axis shardings; with `model.lora_rank` > 0
  the model carries LoRA adapters (grpo_jax/model/lora.py), drawn from the seed's own stream."""
  m = config.model
  lora_key = jax.random.fold_in(jax.random.key(config.seed), 1)
  if m.hf_path:
    from grpo_jax.model import hf_io
    model = hf_io.from_pretrained(m.hf_path, param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat,
                                  attention=m.attention, mesh=mesh)
    config_lib.check_context(config, model.cfg.max_position_embeddings,
                             f"max_position_embeddings of {m.hf_path}/config.json")
    if not m.lora_rank:
      return nnx.split(model)
    graphdef, params = nnx.split(lora_lib.add_configured_adapters(model, m, lora_key))
    return graphdef, jax.device_put(params, sharding_lib.param_shardings(params, mesh))
  vocab = m.vocab_size or tokenizer.vocab_size
  if vocab < tokenizer.vocab_size:
    raise ValueError(f"config.model.vocab_size: {vocab} is smaller than the tokenizer's {tokenizer.vocab_size}")
  cfg = ModelConfig(vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                    num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                    head_dim=m.head_dim, max_position_embeddings=m.max_position_embeddings,
                    rope_theta=m.rope_theta, rms_norm_eps=m.rms_norm_eps,
                    tie_word_embeddings=m.tie_word_embeddings, param_dtype=m.param_dtype, dtype=m.dtype,
                    remat=m.remat, attention=m.attention)

  def make(key):
    return lora_lib.add_configured_adapters(Transformer(cfg, rngs=nnx.Rngs(params=key)), m, lora_key)

  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: make(jax.random.key(0))))
  shardings = sharding_lib.param_shardings(abstract, mesh)
  # One compiled initializer (initializing eagerly compiles one small program per parameter).
  init = jax.jit(lambda key: nnx.split(make(key))[1], out_shardings=shardings)
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
                    max_completion_length=config_lib.completion_width(config), tis_cap=g.tis_cap or None)


def make_samplers(graphdef, config, tokenizer):
  """(training sampler, greedy evaluation sampler, pass@k sampler or None); with `env.name`, episode samplers
  (grpo_jax/sampling/episodes.py) around samplers that also stop at the environment's stop strings."""
  s, e = config.sampling, config.env
  make_env = env_factory(e.name) if e.name else None
  extra_stops = stop_token_ids(make_env(), tokenizer) if make_env else ()
  if config.task.answer_only:  # reasoning_gym's answer-only mode: stop where the model closes the <answer> tag.
    extra_stops += closing_tag_ids(tokenizer)
  common = dict(max_new_tokens=s.max_new_tokens, stop_ids=tuple(stop_ids(tokenizer)) + extra_stops,
                pad_id=tokenizer.pad_token_id)
  # Prompts are padded to the smallest of the update's widths (grpo.length_buckets) that holds the longest one:
  # at most that many prompt shapes per run, each compiled once. A later turn's context (prompt and episode so
  # far) is padded likewise, to buckets of their combined width.
  context = s.max_prompt_length + (e.max_episode_tokens if make_env else 0)
  buckets = dict(prompt_widths=bucket_widths(context, config.grpo.length_buckets))

  def sampler(cfg: SamplingConfig):
    turn = Sampler(graphdef, cfg, **buckets)
    if make_env is None:
      return turn
    return EpisodeSampler(turn, make_env, tokenizer, max_turns=e.max_turns, max_episode_tokens=e.max_episode_tokens,
                          max_observation_tokens=e.max_observation_tokens, step_timeout_s=e.step_timeout_s,
                          max_concurrent_steps=e.max_concurrent_steps)

  train = sampler(SamplingConfig(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, **common))
  greedy = sampler(SamplingConfig(temperature=s.temperature, greedy=True, **common))
  pass_k = None
  if config.eval.pass_k > 0:
    pass_k = sampler(SamplingConfig(temperature=config.eval.pass_k_temperature, **common))
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


class RunState(NamedTuple):
  """Everything a checkpoint holds of a run besides its config: `arrays()` is the saved array tree (the same
  layout as before this type existed), the rest goes into the checkpoint's metadata (`_meta`)."""
  params: Any
  opt_state: Any
  ref_params: Any            # the reference policy (None with beta = 0; in host memory with offload_ref_params)
  step: int                  # the last GRPO step done (0: the starting point)
  data_position: int         # training rows consumed so far (the data order is fixed by the seed)
  initial_eval: dict         # held-out metrics of the starting point
  run_id: str
  wall_before: float         # seconds earlier processes of this run spent, up to the restored checkpoint

  def arrays(self) -> dict:
    tree = {"params": self.params, "opt_state": self.opt_state}
    if self.ref_params is not None:
      tree["ref_params"] = self.ref_params
    return tree


class _Run:
  """The fixed parts of one run, built once: data, model programs (compiled on first use), samplers, rewards."""

  def __init__(self, config, inputs: RunInputs, log):
    self.config, self.log = config, log
    g, s = config.grpo, config.sampling
    self.tokenizer, self.task = build_tokenizer_and_task(config, log=log, inputs=inputs)
    self.mesh = sharding_lib.make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
    self.graphdef, self.initial_params = build_model(config, self.tokenizer, self.mesh)
    # LoRA: only the adapters train; the reference (and the warm start) is the base model, without adapters.
    self.lora = lora_lib.from_config(config.model)
    self.trainable = nnx.LoRAParam if self.lora else None
    self.base_fingerprint: str | None = None  # LoRA: of the frozen base, stored with every checkpoint
    self.base_graphdef = (lora_lib.base_graphdef(self.graphdef, self.initial_params) if self.lora
                          else self.graphdef)
    if self.lora:
      n_adapters, n_all = lora_lib.count(self.initial_params)
      log(f"[lora] rank {self.lora.rank}, alpha {self.lora.alpha:g} on {', '.join(self.lora.targets)}: "
          f"{n_adapters:,} trainable parameters of {n_all:,} ({100 * n_adapters / n_all:.2f}%)")
    self.place = _BatchPlacer(self.mesh)
    mini, micro = config_lib.mini_batch_size(config), config_lib.micro_batch_size(config)
    repeats = config_lib.prompt_repeats(config)
    self.updates_per_step = g.num_iterations * (config_lib.rollout_batch_size(config) // mini)
    optim = OptimConfig.from_config(config.optim)
    self.schedule = learning_rate_schedule(optim, config.num_steps, self.updates_per_step)
    self.optimizer = make_optimizer(optim, self.schedule)
    # Fixed shardings in and out, so the donated outputs feed the next call without a recompile.
    param_sh = jax.tree.map(lambda x: x.sharding, self.initial_params)
    trainable = self.trainable_part(self.initial_params)
    opt_sh = opt_state_shardings(jax.eval_shape(self.optimizer.init, trainable), trainable,
                                 self.mesh)  # shapes only: the state itself is made once, by new_state
    self.copy_params = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=param_sh)
    self.offloader = RefOffloader(config.model.offload_ref_params, self.mesh)  # host memory between uses
    self.train_step = jax.jit(make_train_step(
        self.graphdef, self.optimizer, loss_config(config), num_iterations=g.num_iterations, mini_batch_size=mini,
        micro_batch_size=micro, temperature=s.temperature, chunk_size=config.model.logprob_chunk_size,
        prompt_repeats=repeats, trainable=self.trainable),
        donate_argnums=(0, 1), out_shardings=(param_sh, opt_sh, NamedSharding(self.mesh, PartitionSpec())))
    self.ref_logprobs = jax.jit(make_logprob_fn(self.base_graphdef, temperature=s.temperature,
                                                chunk_size=config.model.logprob_chunk_size, micro_batch_size=micro,
                                                prompt_repeats=repeats))
    self.sampler, self.greedy_sampler, self.pass_k_sampler = make_samplers(self.graphdef, config, self.tokenizer)
    self.settings = RolloutSettings.from_config(config, build_reward_fns(config, inputs))
    self.base_key = jax.random.key(config.seed)
    self.eval_columns = self.task.eval_rows(config.eval.size)
    self.transfer_columns = {name: self.task.transfer_rows(name, config.eval.size)
                             for name in getattr(self.task, "transfer_sets", ())}
    # Multi-host: this process loads prompts [offset, offset + count) of each step's rollout batch.
    self.offset, self.count = ((0, g.prompts_per_step) if jax.process_count() == 1 else
                               distributed.local_prompt_slice(self.mesh, g.prompts_per_step, g.group_size))
    self.global_sampler = distributed.GlobalSampler(self.sampler, self.offset * g.group_size)

  def new_state(self, params, step: int, data_position: int, initial_eval: dict, run_id: str,
                wall_before: float = 0.0) -> RunState:
    """A run state starting from `params`: fresh AdamW state (of the adapters alone with LoRA), and the
    reference a copy of `params` (with LoRA none: the reference is the base model inside `params`)."""
    ref = (self.offloader.park(self.copy_params(params)) if self.config.grpo.beta > 0 and not self.lora
           else None)
    opt_state, _ = init_opt_state(self.optimizer, self.trainable_part(params), self.mesh)
    return RunState(params, opt_state, ref, step, data_position, initial_eval, run_id, wall_before)

  def checkpoint_arrays(self, state: RunState) -> dict:
    """The arrays a checkpoint holds: `state.arrays()`; with LoRA the adapters and their optimizer state alone,
    since the base never changes (`restore_lora_base` reads it back, checked against the fingerprint that
    `save_checkpoint` stores)."""
    if not self.lora:
      return state.arrays()
    return {"adapters": self.trainable_part(state.params), "opt_state": state.opt_state}

  def save_checkpoint(self, checkpointer: Checkpointer, step: int, state: RunState, meta: dict) -> None:
    if self.lora:
      if self.base_fingerprint is None:  # once per process: the base is frozen
        self.base_fingerprint = checkpoint_lib.lora_base_fingerprint(self.base_part(state.params))
      meta = dict(meta, lora_base_fingerprint=self.base_fingerprint)
    checkpointer.save(step, self.checkpoint_arrays(state), meta)

  def trainable_part(self, params):
    """The parameters the update optimizes: the adapters with LoRA, else all of them."""
    return lora_lib.split_adapters(params)[0] if self.lora else params

  def base_part(self, params):
    """The parameters of the base model (without adapters; all of them without LoRA)."""
    return lora_lib.split_adapters(params)[1] if self.lora else params

  def with_initial_adapters(self, base_params):
    """Base parameters -> the policy's: with LoRA, the base plus this run's freshly drawn adapters (B = 0, so
    the policy equals the base)."""
    if not self.lora:
      return base_params
    return lora_lib.join(lora_lib.split_adapters(self.initial_params)[0], base_params)

  def reference_params(self, state: RunState):
    """The reference policy's parameters (read with `base_graphdef`), or None with beta = 0."""
    if self.config.grpo.beta <= 0:
      return None
    if self.lora:
      return self.base_part(state.params)
    return self.offloader.fetch(state.ref_params)

  def evaluate(self, params, step: int) -> dict:
    """Held-out metrics eval/*; at the first and last step also transfer/<name>/* for each transfer set."""
    c = self.config
    kwargs = dict(accuracy_reward=c.eval.accuracy_reward, max_prompt_length=c.sampling.max_prompt_length,
                  batch_size=min(c.eval.batch_size, c.eval.size),
                  key=jax.random.fold_in(self.base_key, 10_000_000 + step))
    metrics = evaluate(self.greedy_sampler, params, self.tokenizer, self.eval_columns, self.settings.scoring,
                       pass_k=c.eval.pass_k, pass_k_sampler=self.pass_k_sampler, **kwargs)
    if step in (0, c.num_steps):
      for name, columns in self.transfer_columns.items():
        transfer = evaluate(self.greedy_sampler, params, self.tokenizer, columns, self.settings.scoring, **kwargs)
        metrics.update({f"transfer/{name}/" + k.split("/", 1)[1]: v for k, v in transfer.items()})
    return metrics

  def rollout(self, state: RunState, step: int):
    """(the step's complete batch, placed on the mesh, reference log-probs included; the Rollout; the new data
    position). Training rows are read from the state's data position on."""
    g = self.config.grpo
    position = [state.data_position]

    def next_columns():  # this process's prompts of the next prompts_per_step rows; advances the position
      columns = self.task.train_rows(position[0] + self.offset, self.count)
      position[0] += g.prompts_per_step
      return columns

    key = jax.random.fold_in(self.base_key, step)
    if g.dynamic_sampling:  # DAPO: more prompts until the batch has prompts_per_step groups with signal
      rollout = collect_dynamic_rollout(self.global_sampler, state.params, self.tokenizer, next_columns,
                                        self.settings, key, max_rounds=g.dynamic_sampling_max_rounds,
                                        all_done=distributed.all_true)
    else:
      rollout = collect_rollout(self.global_sampler, state.params, self.tokenizer, next_columns(), self.settings,
                                key)
    # One process: cut padding to a bucket width (multi-host processes would each cut differently).
    one_process = jax.process_count() == 1
    check_prompt_runs(rollout.batch, config_lib.prompt_repeats(self.config))
    batch = self.place(trim_padding(rollout.batch, g.length_buckets, self.config.sampling.max_prompt_length)
                       if one_process else rollout.batch)
    ref_params = self.reference_params(state)
    if ref_params is not None:
      t0 = time.perf_counter()
      ref_logp = self.ref_logprobs(ref_params, batch).block_until_ready()
      rollout.metrics["timing/reference_s"] = time.perf_counter() - t0
      batch = batch._replace(ref_logp_BxC=ref_logp)
    return batch, rollout, position[0]

  def update(self, state: RunState, batch: RolloutBatch, step: int) -> tuple[RunState, dict]:
    t0 = time.perf_counter()
    params, opt_state, metrics = self.train_step(state.params, state.opt_state, batch)
    metrics = jax.device_get(metrics)  # waits for the update
    metrics["timing/update_s"] = time.perf_counter() - t0
    ref = state.ref_params
    g = self.config.grpo
    if ref is not None and g.ref_reset_every and step % g.ref_reset_every == 0:
      ref = self.offloader.park(self.copy_params(params))  # iterative GRPO: the reference becomes the policy
    return state._replace(params=params, opt_state=opt_state, ref_params=ref, step=step), metrics


def _train(config, workdir: str, t_start: float, main: bool, log_console, inputs: RunInputs) -> Summary:
  cfg_json = _prepare_workdir(config, workdir, main)
  run = _Run(config, inputs, log_console)
  checkpointer = Checkpointer(os.path.join(workdir, CHECKPOINT_DIR), config.checkpoint.keep,
                              config.checkpoint.verify, config.checkpoint.get("async_save", True))
  writer = bar = None
  try:
    state = _restore(run, checkpointer, workdir, main, log_console)
    inputs_lib.check_or_record(workdir, inputs, resuming=state is not None, main=main)
    fresh = state is None
    if fresh:
      state = _start(run, workdir, main, log_console, cfg_json)
    writer = (metrics_lib.MetricsWriter(workdir, tensorboard=config.log.tensorboard,
                                        resume_step=None if fresh else state.step,
                                        wandb=_wandb_init(config, workdir, state.run_id, cfg_json))
              if main else distributed.NullWriter())
    if fresh:
      writer.write(0, state.initial_eval)
      run.save_checkpoint(checkpointer, 0, state, _meta(config, state, time.time() - t_start, cfg_json))
    # Every process reads the file (process 0 writes it): they all return the same summary.
    last_eval = (dict(state.initial_eval) if state.step == 0 else
                 _last_eval(os.path.join(workdir, metrics_lib.METRICS_FILE), state.initial_eval, state.step))
    g = config.grpo
    log_console(f"[start] step {state.step}/{config.num_steps}, held-out accuracy {last_eval['eval/accuracy']:.3f};"
                f" rollout batch {g.prompts_per_step} prompts x G={g.group_size}, {run.updates_per_step} update(s)"
                "/step")
    bar = metrics_lib.ProgressBar(config.num_steps, state.step, config.log.progress_bar and main)
    bar.accuracy = last_eval["eval/accuracy"]
    nonfinite_steps = 0  # consecutive steps whose every update was skipped
    for step in range(state.step + 1, config.num_steps + 1):
      t0 = time.time()
      batch, rollout, data_position = run.rollout(state, step)
      state, step_metrics = run.update(state._replace(data_position=data_position), batch, step)
      nonfinite_steps = nonfinite_steps + 1 if step_metrics["skipped_updates"] == run.updates_per_step else 0
      if nonfinite_steps >= MAX_NONFINITE_STEPS:
        raise _diverged(config, step, nonfinite_steps, step_metrics)
      metrics = _step_metrics(run, rollout, step_metrics, step, time.time() - t0)
      if step % config.eval.every == 0 or step == config.num_steps:
        last_eval = run.evaluate(state.params, step)
        metrics.update(last_eval)
      _log_step(config, writer, bar, main, step, metrics, rollout)
      stop = any([bool(callback(step, dict(metrics))) for callback in inputs.callbacks])  # every one is called
      if step % config.checkpoint.every == 0 or step == config.num_steps or stop:
        writer.flush()
        run.save_checkpoint(checkpointer, step, state, _meta(config, state, state.wall_before + time.time() - t_start,
                                                       cfg_json))
      if stop:
        log_console(f"[stop] a callback ended the run after step {step} (checkpoint saved; the same call resumes it)")
        break
    if config.checkpoint.export_hf:
      write_hf_model(run.graphdef, state.params, config, run.tokenizer, os.path.join(workdir, EXPORT_DIR),
                     log=log_console)
  finally:  # also when interrupted: flush what was logged, release orbax's threads.
    if bar is not None:
      bar.close()
    if writer is not None:
      writer.close()
    checkpointer.close()
  return _finish(config, workdir, state, last_eval, t_start, main, log_console)


def _prepare_workdir(config, workdir: str, main: bool) -> str:
  """Creates the workdir, marks the run unfinished and writes config.json; returns the config's JSON."""
  os.makedirs(workdir, exist_ok=True)
  # The summary marks a finished run; this one is not yet.
  if main and os.path.exists(os.path.join(workdir, SUMMARY_FILE)):
    os.remove(os.path.join(workdir, SUMMARY_FILE))
  cfg_json = config.to_json_best_effort(indent=2, sort_keys=True)
  if main:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(cfg_json)
  return cfg_json


def _restore(run: _Run, checkpointer: Checkpointer, workdir: str, main: bool, log) -> RunState | None:
  """The run state of the latest readable checkpoint in the workdir, or None (refusing to start afresh over a
  run's history)."""
  config = run.config
  restored = None
  if checkpointer.all_steps():
    template = run.new_state(run.initial_params, 0, 0, {}, "")
    # The abstract target carries the shardings of this run's mesh: a checkpoint restores onto any mesh.
    restored = checkpointer.restore_latest(checkpoint_lib.abstract_like(run.checkpoint_arrays(template)))
  if restored is None:
    _refuse_to_overwrite_history(workdir)
    return None
  meta = restored.meta
  if meta.get("seed") != config.seed:
    raise errors.ConfigError(f"workdir {workdir} holds a run with seed {meta.get('seed')}, not config.seed="
                     f"{config.seed}; use another workdir")
  # Legacy checkpoints (no run id) count as this run's.
  own = meta.get("run_id") in (None, _read_run_id(workdir))
  if not own:
    log(f"[resume] the checkpoint was written by another run (run id {meta.get('run_id')}): its time is not "
        "counted in wall_s_total")
  arrays = restored.state
  params = arrays.get("params")
  if run.lora:  # the checkpoint holds the adapters: the base is the run's starting point, checked
    base = checkpoint_lib.restore_lora_base(workdir, run.base_part(run.initial_params),
                                            meta.get("lora_base_fingerprint"))
    run.base_fingerprint = meta.get("lora_base_fingerprint")
    params = lora_lib.join(arrays["adapters"], base)
  log(f"[resume] restored step {restored.step} from {checkpointer.directory}")
  return RunState(params, arrays["opt_state"], arrays.get("ref_params"), restored.step,
                  int(meta["data_position"]), meta["initial_eval"],
                  meta.get("run_id") if own else _new_run_id(workdir, main),
                  float(meta.get("elapsed_s", 0.0)) if own else 0.0)


def _start(run: _Run, workdir: str, main: bool, log, cfg_json: str) -> RunState:
  """The starting point of a new run: another run's (warmstart.init_checkpoint), this run's own saved warm
  start (a kill after it was saved), a fresh warm start, or the initial model; with its held-out metrics."""
  config = run.config
  run_id = _new_run_id(workdir, main)
  # The starting point is a base model (with LoRA, the adapters are added after it: a warm start trains all
  # the base's weights, and the reference is the base it produced), saved like a full fine-tuning run's.
  params, data_position = run.base_part(run.initial_params), 0
  own_start = os.path.join(workdir, WARMSTART_DIR)
  start_saved = checkpoint_lib.has_initial_state(own_start)  # a kill after the warm-start save, before checkpoint 0
  source = config.warmstart.init_checkpoint or (own_start if config.warmstart.enabled and start_saved else "")
  if source:  # another run's starting point, or this run's saved warm start (bit for bit the same)
    params, data_position, initial_eval = _load_initial_state(source, params, workdir, main, log)
  elif config.warmstart.enabled:
    s = config.sampling
    params, info = run_warmstart(
        config.warmstart, task=run.task, tokenizer=run.tokenizer, graphdef=run.base_graphdef, params=params,
        max_prompt_length=s.max_prompt_length, max_new_tokens=config_lib.completion_width(config),
        chunk_size=config.model.logprob_chunk_size, evaluate=lambda p: run.evaluate(run.with_initial_adapters(p), 0),
        log=log, mesh=run.mesh)
    if main:
      with open(os.path.join(workdir, metrics_lib.WARMSTART_FILE), "w") as f:
        for rec in info["history"]:
          f.write(json.dumps(rec) + "\n")
    data_position, initial_eval = info["rows"], info["eval"]
  else:
    initial_eval = run.evaluate(run.with_initial_adapters(params), 0)
  if (config.warmstart.enabled or config.warmstart.init_checkpoint) and not start_saved:
    # The starting point on its own, never rotated out like checkpoints/0: other runs can start from it.
    save_initial_state(own_start, params, {"data_position": int(data_position), "initial_eval": initial_eval,
                                           "seed": int(config.seed), "config": json.loads(cfg_json)},
                       config.checkpoint.verify)
  return run.new_state(run.with_initial_adapters(params), 0, data_position, initial_eval, run_id)


def _step_metrics(run: _Run, rollout, step_metrics: dict, step: int, step_time: float) -> dict[str, Any]:
  metrics: dict[str, Any] = distributed.merge_metrics(rollout.metrics)
  metrics.update({k: float(v) for k, v in step_metrics.items()})
  metrics["learning_rate"] = float(run.schedule((step - 1) * run.updates_per_step))
  metrics["step_time"] = step_time
  metrics["tokens_per_s"] = rollout.num_tokens / step_time
  # What the timed phases (sampling, rewards, reference, update) leave: data, tokenizing, placement, logging.
  metrics["timing/other_s"] = step_time - sum(v for k, v in metrics.items() if k.startswith("timing/"))
  return metrics


def _log_step(config, writer, bar, main: bool, step: int, metrics: dict, rollout) -> None:
  """metrics.jsonl (every log.every steps, evaluation steps and the last), samples, the progress bar."""
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


def _diverged(config, step: int, nonfinite_steps: int, step_metrics: dict) -> FloatingPointError:
  return FloatingPointError(
      f"steps {step - nonfinite_steps + 1}..{step}: every update had a non-finite loss, gradient or result "
      f"and was skipped (grad_norm {float(step_metrics['grad_norm'])}); the last checkpoint holds finite "
      f"parameters. Likely causes: a learning rate too high (optim.learning_rate={config.optim.learning_rate}"
      f"), float16 overflow (model.dtype={config.model.dtype}), or a reward of NaN/inf.")


def _finish(config, workdir: str, state: RunState, last_eval: dict, t_start: float, main: bool, log) -> Summary:
  """The plot and summary.json of a run that reached its last step (or was stopped by a callback)."""
  plot_path = None
  if config.log.plot and main:
    from grpo_jax.train.plotting import plot_runs
    plot_path = plot_runs([workdir], os.path.join(workdir, PLOT_FILE))
  this_process = time.time() - t_start
  summary = Summary(accuracy_before=state.initial_eval["eval/accuracy"], accuracy_after=last_eval["eval/accuracy"],
                    steps=state.step, wall_s=state.wall_before + this_process, plot_path=plot_path,
                    workdir=workdir, wall_s_this_process=this_process,
                    wall_s_total=state.wall_before + this_process)
  if main:
    with open(os.path.join(workdir, SUMMARY_FILE), "w") as f:
      json.dump(dataclasses.asdict(summary), f, indent=2)
  log(summary.line())
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
    raise errors.ConfigError(f"workdir {workdir} holds a run started with other settings, which a resume would mix into "
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
    raise errors.WorkdirError(f"workdir {workdir} has a history of {max(steps)} GRPO steps in {path} but no readable "
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
      raise errors.WorkdirError(f"workdir {os.path.dirname(self.path)} is in use by {holder}; wait for it to finish or "
                         "use another --workdir") from None
    self._file.seek(0)
    self._file.truncate()
    self._file.write(f"process {os.getpid()} on {os.uname().nodename}\n")
    self._file.flush()
    return self

  def __exit__(self, *exc):
    self._file.close()  # releases the lock


def _load_initial_state(source: str, params, workdir: str, main: bool, log) -> tuple[Any, int, dict]:
  """(params, data position, step-0 evaluation) of another run's starting point (`warmstart.init_checkpoint`),
  or of this run's own warm start saved before a kill.

  The step-0 state is a function of the parameters (fresh optimizer state, reference = policy), so this is
  exactly the state that run started GRPO from. Its warm-start log is copied; its time is not counted here."""
  directory, step = checkpoint_lib.initial_state_dir(source)
  params, meta = restore_params(directory, step, checkpoint_lib.abstract_like(params))
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


def _meta(config, state: RunState, elapsed_s: float, cfg_json: str) -> dict:
  """A checkpoint's metadata. elapsed_s: seconds this run (its run id) has spent up to this checkpoint, over all
  its processes."""
  key_data = jax.random.key_data(jax.random.key(config.seed))
  return {"step": int(state.step), "run_id": state.run_id, "data_position": int(state.data_position),
          "seed": int(config.seed), "rng_key_data": np.asarray(key_data).tolist(),
          "initial_eval": state.initial_eval, "elapsed_s": float(elapsed_s), "config": json.loads(cfg_json)}


def _last_eval(metrics_path: str, default: dict, step: int) -> dict:
  """The most recent evaluation in metrics.jsonl up to `step` (after a resume from `step`; records past it,
  from before a crash, are dropped by process 0's writer, which other processes may not have waited for)."""
  last = default
  for rec in metrics_lib.read_jsonl(metrics_path):
    if "eval/accuracy" in rec and rec.get("step", 0) <= step:
      last = {k: v for k, v in rec.items() if k.startswith("eval/")}
  return last
