"""Building a run's parts from its settings (grpo_jax/settings.py, checked once by grpo_jax/train/checks.py):
tokenizer and task, model, reward functions, loss settings, samplers, and the placement of rollout batches on
the mesh. The launcher, the Python API (`loop.train`) and the commands that load a run all come here.
"""
from __future__ import annotations

import math

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax import errors, storage
from grpo_jax.algo.objective import LossConfig
from grpo_jax.data.tasks import make_task, stop_ids, task_stop_ids
from grpo_jax.envs import env_factory, stop_token_ids
from grpo_jax.model import ModelConfig, Transformer, hf_io
from grpo_jax.model import lora as lora_lib
from grpo_jax.model import sharding as sharding_lib
from grpo_jax.rewards import gate_on_format, get_reward, make_overlong_reward
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.sampling.episodes import EpisodeSampler
from grpo_jax.settings import Settings
from grpo_jax.train import distributed
from grpo_jax.train.inputs import RunInputs
from grpo_jax.train.rollout import bucket_widths
from grpo_jax.train.step import RolloutBatch


def build_tokenizer_and_task(settings: Settings, log=print, inputs: RunInputs = RunInputs()):
  """log: where the task's one-line data report goes (the main process's console on multi-host runs)."""
  # grpo_jax/data/tasks.py; the tokenizer is the checkpoint's with hf_path.
  task = make_task(settings, log=log, train_rows=inputs.train_dataset, heldout_rows=inputs.eval_dataset)
  return task.tokenizer, task


def build_model(settings: Settings, tokenizer, mesh):
  """(graphdef, params) with params placed on `mesh` by their logical-axis shardings; with `model.lora_rank` > 0
  the model carries LoRA adapters (grpo_jax/model/lora.py), drawn from the seed's own stream."""
  m = settings.model
  lora_key = jax.random.fold_in(jax.random.key(settings.seed), 1)
  if m.hf_path:
    model = hf_io.from_pretrained(storage.local_dir(m.hf_path), param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat,
                                  attention=m.attention, decode_attention=m.decode_attention, mesh=mesh,
                                  moe_impl=settings.moe.impl)
    settings.check_context(model.cfg.max_position_embeddings, f"max_position_embeddings of {m.hf_path}/config.json")
    check_expert_axis(model.cfg, mesh)
    if not m.lora_rank:
      return nnx.split(model)
    graphdef, params = nnx.split(lora_lib.add_configured_adapters(model, m, lora_key))
    return graphdef, jax.device_put(params, sharding_lib.param_shardings(params, mesh))
  vocab = m.vocab_size or tokenizer.vocab_size
  if vocab < tokenizer.vocab_size:
    raise ValueError(f"config.model.vocab_size: {vocab} is smaller than the tokenizer's {tokenizer.vocab_size}")
  cfg = ModelConfig.fresh(m, vocab, settings.moe)
  check_expert_axis(cfg, mesh)

  def make(key):
    return lora_lib.add_configured_adapters(Transformer(cfg, rngs=nnx.Rngs(params=key)), m, lora_key)

  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: make(jax.random.key(0))))
  shardings = sharding_lib.param_shardings(abstract, mesh)
  # One compiled initializer (initializing eagerly compiles one small program per parameter).
  init = jax.jit(lambda key: nnx.split(make(key))[1], out_shardings=shardings)
  return graphdef, init(jax.random.fold_in(jax.random.key(settings.seed), 0))


def check_expert_axis(cfg: ModelConfig, mesh) -> None:
  """An 'expert' mesh axis must divide the model's experts (each shard holds E / ways whole experts)."""
  ways = dict(mesh.shape).get("expert", 1)
  if ways > 1 and (not cfg.num_experts or cfg.num_experts % ways):
    raise errors.ConfigError(f"config.mesh.expert={ways} does not divide the model's {cfg.num_experts} experts: "
                             f"set mesh.expert to a divisor of {cfg.num_experts or 'them'} (1: no expert axis)")


def build_reward_fns(settings: Settings, inputs: RunInputs = RunInputs()):
  gates = settings.reward_gates  # name -> format reward: the named reward counts only where the format is right.
  fns = [(name, gate_on_format(name, gates[name]) if name in gates else get_reward(name), float(weight))
         for name, weight in settings.configured_rewards.items()]
  clash = {name for name, _, _ in fns} & {name for name, _, _ in inputs.reward_specs()}
  if clash:
    raise ValueError(f"reward_funcs: {sorted(clash)} is also a reward of the config; rename the callable")
  fns += inputs.reward_specs()
  g = settings.grpo
  if g.overlong_buffer > 0:
    fns.append(("overlong_penalty", make_overlong_reward(settings.sampling.max_new_tokens, g.overlong_buffer,
                                                         g.overlong_penalty_factor), 1.0))
  return fns


def loss_config(settings: Settings) -> LossConfig:
  """The `grpo` section's loss knobs at the run's completion width."""
  return LossConfig.from_settings(settings.grpo, settings.completion_width)


def make_samplers(graphdef, settings: Settings, tokenizer):
  """(training sampler, greedy evaluation sampler, the sampler of eval.samples at eval.temperature or None); with
  `env.name`, episode samplers (grpo_jax/sampling/episodes.py) around samplers that also stop at the
  environment's stop strings."""
  s, e = settings.sampling, settings.env
  make_env = env_factory(e.name) if e.name else None
  extra_stops = stop_token_ids(make_env(), tokenizer) if make_env else ()
  extra_stops += task_stop_ids(settings, tokenizer)  # the task's own stop rules (grpo_jax/data/tasks.py)
  common = dict(stop_ids=tuple(stop_ids(tokenizer)) + extra_stops, pad_id=tokenizer.pad_token_id)
  # Prompts are padded to the smallest of the update's widths (grpo.length_buckets) that holds the longest one:
  # at most that many prompt shapes per run, each compiled once. A later turn's context (prompt and episode so
  # far) is padded likewise, to buckets of their combined width.
  context = s.max_prompt_length + (e.max_episode_tokens if make_env else 0)
  buckets = dict(prompt_widths=bucket_widths(context, settings.grpo.length_buckets))

  def sampler(cfg: SamplingConfig):
    turn = Sampler(graphdef, cfg, **buckets)
    if make_env is None:
      return turn
    return EpisodeSampler(turn, make_env, tokenizer, max_turns=e.max_turns, max_episode_tokens=e.max_episode_tokens,
                          max_observation_tokens=e.max_observation_tokens, step_timeout_s=e.step_timeout_s,
                          max_concurrent_steps=e.max_concurrent_steps)

  train = sampler(SamplingConfig.from_config(s, **common))
  greedy = sampler(SamplingConfig.from_config(s, greedy=True, top_k=0, top_p=1.0, **common))
  sampled = (sampler(SamplingConfig.from_config(s, temperature=settings.eval.temperature, top_k=0, top_p=1.0,
                                                **common)) if settings.eval.samples > 0 else None)
  return train, greedy, sampled


class BatchPlacer:
  """Puts rollout arrays on the mesh, split along 'data'/'fsdp' (and 'expert') when the batch divides evenly."""

  def __init__(self, mesh):
    self.mesh = mesh
    self.axes = sharding_lib.batch_axes(mesh)
    self.ways = math.prod(mesh.shape[a] for a in self.axes)

  def __call__(self, batch: RolloutBatch) -> RolloutBatch:
    if jax.process_count() > 1:  # each process holds its own rows: assemble the global arrays
      return distributed.put_batch(batch, self.mesh)

    def put(x):
      if x is None:
        return None
      spec = PartitionSpec(self.axes) if x.shape[0] % self.ways == 0 else PartitionSpec()
      return jax.device_put(x, NamedSharding(self.mesh, spec))
    return RolloutBatch(*[put(x) for x in batch])
