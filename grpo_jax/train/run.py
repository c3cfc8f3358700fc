"""One run's parts, built once from its settings, and the state they act on.

`Run` holds the data, the model and its policy (grpo_jax/train/policy.py), the producer of rollouts
(grpo_jax/train/producer.py: samplers, rewards, advantages), the evaluator and the compiled programs (each traced
once per shape it sees); it prepares a rollout's batch (`prepare`: reference log-probs) and updates (`update`).
`RunState` is what changes from step to step and what a checkpoint holds of it.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax.model.transformer import cast_for_compute
from grpo_jax.train import build, distributed
from grpo_jax.train.evaluation import RunEvaluation
from grpo_jax.train.inputs import RunInputs
from grpo_jax.settings import Settings
from grpo_jax.train.optim import learning_rate_schedule, make_optimizer
from grpo_jax.train.policy import make_policy
from grpo_jax.train.partial import restored_batch, saved_batch
from grpo_jax.train.producer import Producer, make_meshes
from grpo_jax.train.rollout import RolloutSpec, restored_rollout, saved_rollout, trim_padding
from grpo_jax.train.state import init_opt_state, opt_state_shardings
from grpo_jax.train.timing import TimeSplit
from grpo_jax.train.step import RolloutBatch, check_prompt_runs, make_logprob_fn, make_train_step
# Looked up here at call time, so tests can count or interrupt them.
from grpo_jax.train.build import make_samplers


class RunState(NamedTuple):
  """What changes during a run; the arrays go into a checkpoint (`Run.checkpoint_arrays`), the rest into its
  metadata."""
  params: Any
  opt_state: Any
  ref_params: Any            # the policy's reference state (None with beta = 0, or when the policy holds it)
  step: int                  # the last GRPO step done (0: the starting point)
  data_position: int         # training rows consumed so far (the data order is fixed by the seed)
  initial_eval: dict         # held-out metrics of the starting point
  run_id: str
  wall_before: float         # seconds earlier processes of this run spent, up to the restored checkpoint
  # Rollouts sampled ahead (rollout.staleness > 0), for steps step + 1, step + 2, ... in order: host arrays, saved
  # with the checkpoint (with rollout.decode_budget, batches still in flight too: grpo_jax/train/partial.py).
  # data_position is past their rows.
  pending: tuple = ()
  unfinished: Any = None     # restored from a save during the overlapped sampling: `Unfinished`


class Unfinished(NamedTuple):
  """A step saved during the overlapped sampling (a signal: Workdir.save_on_request) before its hooks ran: its
  batch and update metrics, which the resumed run logs, and the sampler's policy (the leaves of the trainable part
  as the sampler holds them, after `policy_step` updates), which samples the batches not yet pending."""
  rollout: Any
  metrics: dict
  seconds: float
  sampler_leaves: list
  policy_step: int


class Run:
  """The fixed parts of one run: data, policy, samplers, rewards, and the compiled programs."""

  def __init__(self, settings: Settings, inputs: RunInputs, log, time_split: TimeSplit | None = None):
    """`settings`: the run's checked settings tree (grpo_jax/train/checks.py: validate)."""
    self.settings = settings
    self.time_split = time_split or TimeSplit()  # evaluations and checkpoint saves add their seconds to it
    g, s = settings.grpo, settings.sampling
    # The trainer's devices, and the sampler's own (overlapped rollouts): checked before anything is built.
    self.mesh, self.sampler_mesh = make_meshes(settings)
    self.tokenizer, self.task = build.build_tokenizer_and_task(settings, log=log, inputs=inputs)
    t0 = time.perf_counter()
    log(f"[model] {'loading ' + settings.model.hf_path if settings.model.hf_path else 'initializing the model'} ...")
    graphdef, self.initial_params = build.build_model(settings, self.tokenizer, self.mesh)
    n = sum(x.size for x in jax.tree.leaves(self.initial_params))
    log(f"[model] {f'{n / 1e6:.1f}M' if n >= 1e6 else f'{n / 1e3:.0f}k'} parameters "
        f"({settings.model.param_dtype}, compute {settings.model.dtype}) in {time.perf_counter() - t0:.1f} s")
    # Fixed shardings in and out, so the donated outputs feed the next call without a recompile.
    param_sh = jax.tree.map(lambda x: x.sharding, self.initial_params)
    copy_params = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=param_sh)
    self.policy = make_policy(settings, graphdef, self.initial_params, self.mesh, copy_params)
    if line := self.policy.describe():
      log(line)
    self.place = build.BatchPlacer(self.mesh)
    mini, micro, repeats = settings.mini_batch_size, settings.micro_batch_size, settings.prompt_repeats
    self.schedule = learning_rate_schedule(settings.optim, settings.num_steps, settings.updates_per_step)
    self.optimizer = make_optimizer(settings.optim, self.schedule)
    trainable = self.policy.trainable_part(self.initial_params)
    opt_sh = opt_state_shardings(jax.eval_shape(self.optimizer.init, trainable), trainable,
                                 self.mesh)  # shapes only: the state itself is made once, by new_state
    self.train_step = jax.jit(make_train_step(
        graphdef, self.optimizer, build.loss_config(settings), num_iterations=g.num_iterations, mini_batch_size=mini,
        micro_batch_size=micro, temperature=s.temperature, chunk_size=settings.model.logprob_chunk_size,
        prompt_repeats=repeats, trainable=self.policy.trainable,
        moe_loss_coefs=(settings.moe.aux_loss_coef, settings.moe.z_loss_coef),
        routing_replay=settings.moe.routing_replay),
        donate_argnums=(0, 1), out_shardings=(param_sh, opt_sh, NamedSharding(self.mesh, PartitionSpec())))
    self.ref_logprobs = jax.jit(make_logprob_fn(self.policy.base_graphdef, temperature=s.temperature,
                                                chunk_size=settings.model.logprob_chunk_size, micro_batch_size=micro,
                                                prompt_repeats=repeats))
    sampler, greedy_sampler, eval_sampler = make_samplers(graphdef, settings, self.tokenizer)
    self.rollout_spec = RolloutSpec.from_settings(settings, build.build_reward_fns(settings, inputs))
    self.base_key = jax.random.key(settings.seed)
    # evaluate(params, step) -> metrics; evaluate.seconds[step]: its time
    self.evaluate = RunEvaluation(settings, self.task, self.tokenizer, greedy_sampler, eval_sampler,
                                  self.rollout_spec.scoring, self.base_key, log, self.time_split)
    # Multi-host: this process loads prompts [offset, offset + count) of each step's rollout batch.
    self.offset, self.count = ((0, g.prompts_per_step) if jax.process_count() == 1 else
                               distributed.local_prompt_slice(self.mesh, g.prompts_per_step, g.group_size))
    model_cfg = nnx.merge(graphdef, self.initial_params).cfg
    same_dtype = model_cfg.jnp_dtype == model_cfg.jnp_param_dtype
    cast = None if same_dtype else jax.jit(lambda p: cast_for_compute(p, model_cfg))
    # Rollouts: batches sampled inline, or on the sampler's own devices during the update.
    self.producer = Producer(settings, self.task, self.tokenizer,
                             distributed.GlobalSampler(sampler, self.offset * g.group_size), self.rollout_spec,
                             self.policy, self.sampler_mesh, cast or (lambda p: p), (self.offset, self.count),
                             distributed.all_true)

  def new_state(self, params, step: int, data_position: int, initial_eval: dict, run_id: str,
                wall_before: float = 0.0) -> RunState:
    """A run state starting from `params`, with a fresh optimizer state and reference."""
    opt_state, _ = init_opt_state(self.optimizer, self.policy.trainable_part(params), self.mesh)
    return RunState(params, opt_state, self.policy.new_reference(params), step, data_position, initial_eval,
                    run_id, wall_before)

  def checkpoint_arrays(self, state: RunState) -> dict:
    return self.policy.checkpoint_arrays(state.params, state.opt_state, state.ref_params)

  def save_checkpoint(self, checkpointer, state: RunState, elapsed_s: float, cfg_json: str,
                      unfinished: Unfinished | None = None) -> None:
    """Saves `state` as checkpoint `state.step` (with what the step left `unfinished`, if saved before its hooks
    ran). elapsed_s: seconds this run (its run id) has spent up to this checkpoint, over all its processes."""
    key_data = jax.random.key_data(jax.random.key(self.settings.seed))
    meta = {"step": int(state.step), "run_id": state.run_id, "data_position": int(state.data_position),
            "seed": int(self.settings.seed), "rng_key_data": np.asarray(key_data).tolist(),
            "initial_eval": state.initial_eval, "elapsed_s": float(elapsed_s), "config": json.loads(cfg_json),
            **self.policy.checkpoint_meta(state.params)}
    saved = [saved_batch(r) for r in state.pending]  # batches sampled ahead (or in flight): part of the checkpoint
    several = jax.process_count() > 1
    if saved:  # with several processes, each one's texts and (unmerged) metrics
      meta["pending"] = [{"by_process": distributed.allgather_json(info)} if several else info for _, info in saved]
    # With several processes each array is the global batch, each process's rows where its devices hold them.
    pending = {str(i): distributed.put_batch(arrays, self.mesh) if several else arrays
               for i, (arrays, _) in enumerate(saved)}
    if unfinished is not None:  # (one process: the sampler's own devices need it)
      pending["unfinished"], info = saved_rollout(unfinished.rollout)
      pending["sampler"] = {str(i): np.asarray(x) for i, x in enumerate(unfinished.sampler_leaves)}
      meta["unfinished"] = {"rollout": info, "metrics": {k: float(v) for k, v in unfinished.metrics.items()},
                            "seconds": unfinished.seconds, "policy_step": unfinished.policy_step}
    with self.time_split.phase("checkpoint"):
      checkpointer.save(state.step, self.checkpoint_arrays(state), meta, pending=pending or None)

  def restored_pending(self, arrays: dict | None, meta: dict) -> tuple[tuple, Unfinished | None]:
    """The inverse of `save_checkpoint`'s pending rollouts (this process's rows, texts and metrics) and of what
    a step saved before its hooks left unfinished (or None)."""
    own = lambda info: info["by_process"][jax.process_index()] if "by_process" in info else info
    columns_at = lambda position: self.task.train_rows(position + self.offset, self.count)  # noqa: E731
    pending = tuple(restored_batch(distributed.local_batch(arrays[str(i)], self.mesh), own(info), columns_at)
                    for i, info in enumerate(meta.get("pending", [])))
    u = meta.get("unfinished")
    if u is None:
      return pending, None
    leaves = [arrays["sampler"][str(i)] for i in range(len(arrays["sampler"]))]
    return pending, Unfinished(restored_rollout(arrays["unfinished"], u["rollout"]), u["metrics"], u["seconds"],
                               leaves, u["policy_step"])

  def prepare(self, rollout, state: RunState, step: int) -> RolloutBatch:
    """The rollout's batch on the mesh for update `step`, with the reference log-probs of `state` (the reference
    as it stands when the batch is used, `ref_reset_every` included)."""
    g = self.settings.grpo
    # One process: cut padding to a bucket width (multi-host processes would each cut differently).
    one_process = jax.process_count() == 1
    check_prompt_runs(rollout.batch, self.settings.prompt_repeats)
    batch = self.place(trim_padding(rollout.batch, g.length_buckets, self.settings.sampling.max_prompt_length)
                       if one_process else rollout.batch)
    rollout.metrics["rollout/staleness"] = step - 1 - rollout.metrics.pop("rollout/policy_step")
    ref_params = self.policy.reference(state.params, state.ref_params)
    if ref_params is not None:
      t0 = time.perf_counter()
      ref_logp = self.ref_logprobs(ref_params, batch).block_until_ready()
      rollout.metrics["timing/reference_s"] = time.perf_counter() - t0
      batch = batch._replace(ref_logp_BxC=ref_logp)
    return batch

  def update(self, state: RunState, batch: RolloutBatch, step: int,
             meanwhile: Callable | None = None) -> tuple[RunState, dict]:
    """The state after update `step` on `batch`. `meanwhile(state, updated)` (overlapped rollouts) runs on the
    host while the update runs on the trainer's devices, and gives the state's pending rollouts and data position
    (`updated()`: what this returns, waiting for the update); timing/update_s is the update's wall time less what
    `meanwhile` took (its own seconds: the producer's)."""
    t0 = time.perf_counter()
    outputs = self.train_step(state.params, state.opt_state, batch)  # dispatched, not waited for
    producing = 0.0
    if meanwhile is not None:
      t1 = time.perf_counter()
      before = state
      state = meanwhile(state, lambda: self.updated(before, outputs, step))
      producing = time.perf_counter() - t1
    state, metrics = self.updated(state, outputs, step)
    metrics["timing/update_s"] = time.perf_counter() - t0 - producing
    return state, metrics

  def updated(self, state: RunState, outputs, step: int) -> tuple[RunState, dict]:
    """(`state` after update `step` of `outputs` = the train step's (params, opt_state, metrics), its metrics);
    waits for the update."""
    params, opt_state, metrics = outputs
    metrics = jax.device_get(metrics)
    if "offpolicy/ratio_sq" in metrics:  # the spread of pi_proximal / pi_behaviour over the batch's tokens
      mean, square = float(metrics["offpolicy/ratio"]), float(metrics.pop("offpolicy/ratio_sq"))
      metrics["offpolicy/ratio_std"] = max(square - mean * mean, 0.0) ** 0.5
    metrics["learning_rate"] = self.schedule((step - 1) * self.settings.updates_per_step)  # the step's first
    ref = state.ref_params
    every = self.settings.grpo.ref_reset_every
    if ref is not None and every and step % every == 0:
      ref = self.policy.new_reference(params)  # iterative GRPO: the reference becomes the policy
    return state._replace(params=params, opt_state=opt_state, ref_params=ref, step=step), metrics
