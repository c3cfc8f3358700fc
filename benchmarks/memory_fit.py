#!/usr/bin/env python
"""Does a recipe fit one accelerator? grpo_jax/commands/memory_estimate.py's figures against XLA's own accounting.

  python benchmarks/memory_fit.py --recipe experiments/gsm8k.py --model qwen2.5-0.5b
  python benchmarks/memory_fit.py --recipe experiments/countdown.py --model qwen2.5-3b --steps 2   # on a GPU
  python benchmarks/memory_fit.py --recipe experiments/countdown.py --model qwen2.5-7b --lora-rank 16 --steps 2

The recipe is taken as written (dtypes, remat, the reference model with beta > 0, micro- and mini-batches,
prompt and completion lengths, G x prompts per step); only the model is swapped for random weights of the
named shape (grpo_jax/commands/memory_estimate.py's presets, from the public config.json files), so no checkpoint is
needed. Printed, in GiB on one device:

1. The estimate (`memory_estimate.estimate`) of the update: parameters, gradients, AdamW, activations of one
   micro-batch (with the recipe's remat), and of the whole run (plus the reference and the sampler's KV cache).
2. XLA's memory analysis of the compiled update (`jit(train_step).lower(...).compile().memory_analysis()`):
   arguments + outputs - donated aliases + temporaries, i.e. what the program holds at its peak. It is computed
   for the backend at hand without running anything, so the CPU gives it too (its buffer assignment differs
   from a GPU's in the temporaries). The ratio estimate / XLA is the check.
With --lora-rank R the recipe trains rank-R adapters (`model.lora_rank`, on `--lora-targets`): only they have
gradients and AdamW state, and the reference is the base model itself (so `offload_ref_params` is turned off).

3. With --steps N: N GRPO steps as the trainer runs them (sample G completions per prompt of the fixture data
   with the fixture tokenizer, score, reference log-probs, update), and the device's peak bytes in use after
   each phase (`Device.memory_stats()`, GPUs and TPUs only). Random weights rarely emit a stop token, so the
   completions run to the full length: the worst case. Held-out evaluation is left out (its batch,
   eval.batch_size, is smaller than the rollout batch) and so are checkpoints (a 3B model's parameters, AdamW
   state and reference are 48 GB a checkpoint).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # as grpo-train sets it

GIB = 1024 ** 3


def recipe_config(spec: str):
  """get_config(preset) of `experiments/<recipe>.py[:preset]`."""
  from grpo_jax.sweep.spec import load_module
  preset = spec.partition(":")[2]
  return load_module(spec).get_config(preset or None)


def with_lora(config, rank: int, targets: str = "all"):
  """The recipe with rank-`rank` adapters; no reference offload (the reference is then the base, in place)."""
  config.model.lora_rank = rank
  config.model.lora_targets = targets
  config.model.offload_ref_params = False
  return config


def shapes(config):
  """(B rollout rows, P prompt length, C completion length, mini-batch, micro-batch) of one step."""
  from grpo_jax.settings import Settings
  settings = Settings.from_config(config)
  s = settings.sampling
  return (settings.rollout_batch_size, s.max_prompt_length, s.max_new_tokens, settings.mini_batch_size,
          settings.micro_batch_size)


def model_config(name: str, config):
  from grpo_jax.commands import memory_estimate as me
  m = config.model
  cfg = me.model_config(name, m.param_dtype, m.dtype)
  context = config.sampling.max_prompt_length + config.sampling.max_new_tokens
  return cfg.replace(remat=m.remat, attention=m.attention, decode_attention=m.decode_attention,
                     max_position_embeddings=max(cfg.max_position_embeddings, context))


def make_model(cfg, config, key):
  """A Transformer of shape `cfg` drawn from `key`, with the config's LoRA adapters if it has any."""
  from flax import nnx

  from grpo_jax.model import Transformer
  from grpo_jax.model import lora
  return lora.add_configured_adapters(Transformer(cfg, rngs=nnx.Rngs(params=key)), config.model, key)


def trainable(params, config):
  """The parameters the update optimizes: the adapters with LoRA, else all."""
  from grpo_jax.model import lora
  return lora.split_adapters(params)[0] if config.model.get("lora_rank", 0) else params


def the_estimate(cfg, config) -> dict:
  from grpo_jax.commands import memory_estimate as me
  from grpo_jax.settings import Settings
  B, P, C, _, micro = shapes(config)
  w = me.Workload(sampler_batch=B, prompt_len=P, new_tokens=C, micro_batch=micro,
                  logprob_chunk=config.model.logprob_chunk_size, use_ref=config.grpo.beta > 0,
                  offload_ref=config.model.offload_ref_params,
                  prompt_repeats=Settings.from_config(config).prompt_repeats,
                  lora_rank=config.model.get("lora_rank", 0), lora_targets=config.model.get("lora_targets", "all"))
  est = me.estimate(cfg, me.Mesh(1, 1, 1), w)
  act = est["activations_remat"] if cfg.remat else est["activations"]
  est["update"] = est["params"] + est["grads"] + est["optimizer"] + act
  est["run"] = est["total_remat"] if cfg.remat else est["total"]
  return est


def build_update(cfg, config):
  """(train_step jitted with params and AdamW state donated, abstract params, abstract AdamW state, graphdef)."""
  import jax
  from flax import nnx

  from grpo_jax.settings import Settings
  from grpo_jax.train.build import loss_config
  from grpo_jax.train.optim import learning_rate_schedule, make_optimizer
  from grpo_jax.train.step import make_train_step
  settings = Settings.from_config(config)
  g = settings.grpo
  optimizer = make_optimizer(settings.optim, learning_rate_schedule(settings.optim, settings.num_steps,
                                                                    settings.updates_per_step))
  graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: make_model(cfg, config, jax.random.key(0))))
  abstract_opt = jax.eval_shape(optimizer.init, trainable(abstract_params, config))
  step = jax.jit(make_train_step(graphdef, optimizer, loss_config(settings), num_iterations=g.num_iterations,
                                 mini_batch_size=settings.mini_batch_size,
                                 micro_batch_size=settings.micro_batch_size,
                                 temperature=config.sampling.temperature,
                                 chunk_size=config.model.logprob_chunk_size,
                                 prompt_repeats=settings.prompt_repeats,
                                 trainable=nnx.LoRAParam if config.model.get("lora_rank", 0) else None),
                 donate_argnums=(0, 1))
  return step, abstract_params, abstract_opt, graphdef, optimizer


def abstract_batch(config):
  import jax
  import jax.numpy as jnp

  from grpo_jax.train.step import RolloutBatch
  B, P, C, _, _ = shapes(config)
  i32, f32 = (lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)), (lambda *s: jax.ShapeDtypeStruct(s, jnp.float32))
  return RolloutBatch(prompt_BxP=i32(B, P), prompt_mask_BxP=i32(B, P), completion_BxC=i32(B, C),
                      completion_mask_BxC=i32(B, C), advantages_B=f32(B), sampler_logp_BxC=f32(B, C),
                      ref_logp_BxC=f32(B, C) if config.grpo.beta > 0 else None)


def compiled_update_bytes(step, abstract_params, abstract_opt, config) -> dict:
  t0 = time.time()
  compiled = step.lower(abstract_params, abstract_opt, abstract_batch(config)).compile()
  m = compiled.memory_analysis()
  peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  return {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
          "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes, "peak": peak,
          "compile_s": time.time() - t0}


def device_memory(key: str) -> int | None:
  """A field of the first device's `memory_stats()` ('peak_bytes_in_use', 'bytes_limit'); None on a CPU."""
  import jax
  stats = jax.devices()[0].memory_stats()
  return None if not stats or key not in stats else int(stats[key])


def peak_in_use() -> int | None:
  return device_memory("peak_bytes_in_use")


def random_state(abstract, shardings, key):
  """Random weights of an abstract state's shapes: vectors (norm scales) 1, the rest N(0, 0.02^2), each drawn by a
  small program shared by the leaves of one shape, rather than the model's whole initializer compiled as one."""
  import jax
  import jax.numpy as jnp
  leaves, treedef = jax.tree.flatten(abstract)
  draw = jax.jit(lambda k, shape, dtype: (0.02 * jax.random.normal(k, shape)).astype(dtype), static_argnums=(1, 2))
  keys = jax.random.split(key, len(leaves))
  drawn = [jnp.ones(x.shape, x.dtype) if len(x.shape) == 1 else draw(k, x.shape, x.dtype)
           for k, x in zip(keys, leaves)]
  return jax.device_put(jax.tree.unflatten(treedef, drawn), shardings)


class StepRig:
  """Everything one GRPO step needs on random weights of `cfg`'s shape: the fixture data and tokenizer, the
  parameters, AdamW state and reference on the device, the sampler and the reference's program."""

  def __init__(self, cfg, config, step, graphdef, optimizer, log=print):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from grpo_jax.settings import Settings
    from grpo_jax import testing
    from grpo_jax.model import lora
    from grpo_jax.model import sharding as sharding_lib
    from grpo_jax.train import distributed
    from grpo_jax.train.build import build_reward_fns, build_tokenizer_and_task, make_samplers
    from grpo_jax.train.offload import RefOffloader
    from grpo_jax.train.rollout import RolloutSpec
    from grpo_jax.train.state import init_opt_state
    from grpo_jax.train.step import make_logprob_fn
    paths = testing.ensure_fixtures()
    config.model.hf_path = paths["checkpoint"]  # its tokenizer; the weights below are the real shape's
    config.task.train_path = paths["countdown" if config.task.template == "r1_zero" else "gsm8k"]
    config.task.heldout_path = ""
    config.task.heldout_fraction = 0.25
    self.config, self.step = config, step
    settings = Settings.from_config(config)
    self.tokenizer, self.task = build_tokenizer_and_task(settings, log=log)
    g, s = config.grpo, config.sampling
    micro = shapes(config)[4]
    mesh = sharding_lib.make_mesh(data=1, fsdp=1, tensor=1)
    _, abstract = nnx.split(nnx.eval_shape(lambda: make_model(cfg, config, jax.random.key(0))))
    shardings = sharding_lib.param_shardings(abstract, mesh)
    self.log = log
    self.params = random_state(abstract, shardings, jax.random.key(config.seed))
    log(f"[memory_fit] weights drawn: {_gib(peak_in_use())} GiB")
    self.opt_state, _ = init_opt_state(optimizer, trainable(self.params, config), mesh)
    self.offloader = RefOffloader(config.model.offload_ref_params, mesh)  # host memory between uses, if asked
    copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=shardings)
    self.use_lora = bool(config.model.get("lora_rank", 0))
    ref_graphdef = lora.base_graphdef(graphdef, self.params) if self.use_lora else graphdef
    # With LoRA the reference is the base inside `params`; otherwise a copy of the parameters.
    self.ref_params = None if g.beta <= 0 or self.use_lora else self.offloader.park(copy(self.params))
    self.ref_logprobs = jax.jit(make_logprob_fn(ref_graphdef, temperature=s.temperature,
                                                chunk_size=config.model.logprob_chunk_size, micro_batch_size=micro,
                                                prompt_repeats=settings.prompt_repeats))
    self.sampler = distributed.GlobalSampler(make_samplers(graphdef, settings, self.tokenizer)[0], 0)
    self.settings = RolloutSpec.from_settings(settings, build_reward_fns(settings))
    jax.block_until_ready((self.params, self.opt_state, self.ref_params))
    log(f"[memory_fit] AdamW state and reference placed: {_gib(peak_in_use())} GiB")

  def run_step(self, i: int, data_step: int | None = None, trace_update: str | None = None) -> dict:
    """Step `i` (1-based) on the prompts of step `data_step` (default `i`): seconds and peak device bytes after
    each phase, the update's widths, the loss. With `trace_update` (a directory), the update alone runs under
    jax.profiler (a Perfetto trace there)."""
    import contextlib

    import jax

    from grpo_jax.model import lora
    from grpo_jax.train.rollout import collect_rollout, trim_padding
    g = self.config.grpo
    t0 = time.time()
    columns = self.task.train_rows(((data_step or i) - 1) * g.prompts_per_step, g.prompts_per_step)
    rollout = collect_rollout(self.sampler, self.params, self.tokenizer, columns, self.settings, jax.random.key(i))
    t1 = time.time()
    self.log(f"[memory_fit] step {i}: sampled in {t1 - t0:.1f} s")
    out = {"step": i, "sample_s": t1 - t0, "sample_peak": peak_in_use()}
    batch = jax.device_put(trim_padding(rollout.batch, g.length_buckets))
    if g.beta > 0:
      reference = lora.split_adapters(self.params)[1] if self.use_lora else self.offloader.fetch(self.ref_params)
      batch = batch._replace(ref_logp_BxC=self.ref_logprobs(reference, batch))
      jax.block_until_ready(batch.ref_logp_BxC)
    t2 = time.time()
    self.log(f"[memory_fit] step {i}: reference log-probs in {t2 - t1:.1f} s")
    out.update(reference_s=t2 - t1, reference_peak=peak_in_use())
    traced = (jax.profiler.trace(trace_update, create_perfetto_trace=True) if trace_update
              else contextlib.nullcontext())
    with traced:
      self.params, self.opt_state, metrics = self.step(self.params, self.opt_state, batch)
      jax.block_until_ready((self.params, self.opt_state))
    t3 = time.time()
    out.update(update_s=t3 - t2, update_peak=peak_in_use(), step_s=t3 - t0, loss=float(metrics["loss"]),
               prompt_width=batch.prompt_BxP.shape[1], completion_width=batch.completion_BxC.shape[1],
               prompt_tokens=int(rollout.batch.prompt_mask_BxP.sum()),
               completion_tokens=int(rollout.batch.completion_mask_BxC.sum()))
    return out


def run_steps(cfg, config, num_steps: int, step, graphdef, optimizer, log=print) -> list[dict]:
  """`num_steps` GRPO steps on random weights of `cfg`'s shape; peak device bytes after each phase."""
  rig = StepRig(cfg, config, step, graphdef, optimizer, log=log)
  B, C = shapes(config)[0], config.sampling.max_new_tokens
  rows = [{"phase": "weights, AdamW, reference", "peak": peak_in_use(), "s": 0.0}]
  log(f"[memory_fit] state on the device: peak {_gib(rows[-1]['peak'])} GiB")
  for i in range(1, num_steps + 1):
    r = rig.run_step(i)
    rows += [{"phase": f"step {i}: sample {B} x {C} tokens", "peak": r["sample_peak"], "s": r["sample_s"]},
             {"phase": f"step {i}: reference log-probs", "peak": r["reference_peak"], "s": r["reference_s"]},
             {"phase": f"step {i}: update (completions {r['completion_width']} wide)", "peak": r["update_peak"],
              "s": r["update_s"]}]
    log(f"[memory_fit] step {i}: loss {r['loss']:.4g}, {r['step_s']:.1f} s, peak {_gib(r['update_peak'])} GiB")
  return rows


def _gib(n) -> str:
  return "n/a" if n is None else f"{n / GIB:.2f}"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--recipe", required=True, help="experiments/<recipe>.py[:preset], taken as written")
  p.add_argument("--model", required=True, help="a preset of grpo_jax/commands/memory_estimate.py (qwen2.5-0.5b, ...)")
  p.add_argument("--steps", type=int, default=0, help="also run this many GRPO steps and read peak memory")
  p.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank (model.lora_rank)")
  p.add_argument("--lora-targets", default="all", help="model.lora_targets (default all)")
  args = p.parse_args(argv)

  import jax
  config = recipe_config(args.recipe)
  if args.lora_rank:
    with_lora(config, args.lora_rank, args.lora_targets)
  cfg = model_config(args.model, config)
  B, P, C, mini, micro = shapes(config)
  print(f"{args.recipe} at {args.model} shape ({cfg.num_layers} layers, D {cfg.hidden_size}, V {cfg.vocab_size}), "
        f"params {cfg.param_dtype}, compute {cfg.dtype}, remat {cfg.remat}, beta {config.grpo.beta}, LoRA rank "
        f"{config.model.get('lora_rank', 0)}: rollout "
        f"{B} rows x ({P} prompt + {C} completion), mini-batch {mini}, micro-batch {micro}; "
        f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
  est = the_estimate(cfg, config)
  step, abstract_params, abstract_opt, graphdef, optimizer = build_update(cfg, config)
  xla = compiled_update_bytes(step, abstract_params, abstract_opt, config)
  act = "activations_remat" if cfg.remat else "activations"
  print(f"estimate, update: params {_gib(est['params'])} + grads {_gib(est['grads'])} + AdamW "
        f"{_gib(est['optimizer'])} + activations {_gib(est[act])} = {_gib(est['update'])} GiB")
  print(f"XLA, compiled update ({xla['compile_s']:.0f} s to compile): arguments {_gib(xla['arguments'])} + outputs "
        f"{_gib(xla['outputs'])} - aliased {_gib(xla['aliased'])} + temporaries {_gib(xla['temporaries'])} = "
        f"{_gib(xla['peak'])} GiB")
  print(f"estimate / XLA = {est['update'] / xla['peak']:.3f}")
  limit = device_memory("bytes_limit")
  if limit is not None:  # what XLA's allocator may use: XLA_PYTHON_CLIENT_MEM_FRACTION of the device's memory
    verdict = "fits" if xla["peak"] < limit else "does NOT fit (raise XLA_PYTHON_CLIENT_MEM_FRACTION)"
    print(f"device limit {_gib(limit)} GiB (XLA_PYTHON_CLIENT_MEM_FRACTION="
          f"{os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION']}): the update {verdict}")
  print(f"estimate, whole run (+ reference {_gib(est['ref_params'])} + KV cache {_gib(est['kv_cache'])}): "
        f"{_gib(est['run'])} GiB (an upper bound: the KV cache and the update's activations are never live together)")
  if args.steps:
    rows = run_steps(cfg, config, args.steps, step, graphdef, optimizer)
    print("| phase | peak bytes in use (GiB) | seconds |\n|---|---|---|")
    for r in rows:
      print(f"| {r['phase']} | {_gib(r['peak'])} | {r['s']:.1f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
