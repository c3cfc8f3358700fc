"""Run by test_mesh.py in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8.

The trainer's own pieces (make_train_step, init_opt_state, the loop's batch placement, RefOffloader,
Checkpointer, Sampler) on meshes (data, fsdp, tensor) = (1,1,1) [one device], (2,4,1), (2,2,2).
Prints one JSON object: per mesh the update's metrics, the specs and per-device shard shapes of parameters,
momentum and reference parameters, whether sampling gave the same tokens (and on (2,2,2), whether a grouped
prefill and a decode in segments did); and the cross-mesh checkpoint restores. Writes each mesh's updated
parameters and optimizer state and its samples' log-probs to TMP/<data>x<fsdp>x<tensor>.npz, for the test to
compare.
"""
from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax.algo.objective import LossConfig
from grpo_jax.model import ModelConfig, Transformer, sharding
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.persist.checkpoint import Checkpointer
from grpo_jax.train.build import BatchPlacer
from grpo_jax.train.offload import RefOffloader
from grpo_jax.train.state import init_opt_state, opt_state_shardings
from grpo_jax.train.step import RolloutBatch, make_logprob_fn, make_train_step

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                  num_kv_heads=2, head_dim=8, max_position_embeddings=32)
MESHES = [(1, 1, 1), (2, 4, 1), (2, 2, 2)]  # (8,1,1): data parallelism alone, restored onto below
B, P, N = 16, 6, 5
TEMPERATURE = 0.9
# Two passes over two mini-batches of two micro-batches each: old log-probs, 4 optimizer updates, accumulation.
STEP_ARGS = dict(num_iterations=2, mini_batch_size=8, micro_batch_size=4, temperature=TEMPERATURE, chunk_size=4)
# The meshes' updates are compared with one device's, so with SGD with momentum (linear in the gradients: the
# parameters agree to ulps of their scale) rather than the trainer's AdamW, which divides each coordinate by its own
# gradient's size and so steps a gradient at its rounding error as the CPU rounds it (issue 68). Its momentum is the
# optimizer state sharded like the parameters; global-norm clipping is a reduction over every shard.
OPTIMIZER = optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.1, momentum=0.9))


def _batch() -> RolloutBatch:
  rng = np.random.default_rng(0)
  prompt_len = rng.integers(2, P + 1, B)
  prompt_mask = (np.arange(P)[None] >= P - prompt_len[:, None]).astype(np.int32)
  prompt = rng.integers(2, CFG.vocab_size, (B, P)).astype(np.int32) * prompt_mask
  comp_len = rng.integers(1, N + 1, B)
  comp_mask = (np.arange(N)[None] < comp_len[:, None]).astype(np.int32)
  completion = rng.integers(1, CFG.vocab_size, (B, N)).astype(np.int32) * comp_mask
  adv = rng.normal(size=B).astype(np.float32)
  return RolloutBatch(prompt, prompt_mask, completion, comp_mask, adv, np.zeros((B, N), np.float32), None)


def _spec(s) -> list:
  return [list(x) if isinstance(x, tuple) else x for x in s.spec]


def _layout(tree) -> dict:
  """key path -> (spec, sorted per-device shard shapes, number of shards, memory kind)."""
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if x.ndim == 0:
      continue
    out[jax.tree_util.keystr(path)] = dict(spec=_spec(x.sharding), shards=sorted({tuple(s.data.shape)
                                           for s in x.addressable_shards}), devices=len(x.addressable_shards),
                                           memory_kind=x.sharding.memory_kind)
  return out


def _host(tree) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _max_diff(a: list, b: list) -> float:
  return max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b))


def _flat(tree) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(path): np.asarray(x) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def main(tmp: str):
  assert jax.device_count() == 8, jax.devices()
  graphdef, params0 = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
  _, ref0 = nnx.split(Transformer(CFG, rngs=nnx.Rngs(1)))
  # Host copies: placing them on one device must not alias buffers that the update then donates.
  params0, ref0 = jax.tree.map(np.asarray, (params0, ref0))
  optimizer = OPTIMIZER
  loss_cfg = LossConfig(beta=0.04, epsilon_low=0.2)
  batch_np = _batch()
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=6, temperature=1.0, stop_ids=(1,), pad_id=0))
  # The decode in segments of 2 steps: the cache grows between them and must stay split over the devices.
  segmented = Sampler(graphdef, SamplingConfig(max_new_tokens=6, temperature=1.0, stop_ids=(1,), pad_id=0,
                                               decode_segment=2))
  prompts = [list(map(int, rng_row)) for rng_row in np.random.default_rng(2).integers(2, 64, (8, 5))]
  key = jax.random.key(42)

  out, base = {}, None
  saved = None
  for shape in MESHES:
    devices = jax.devices()[:1] if shape == (1, 1, 1) else None
    mesh = sharding.make_mesh(*shape, devices=devices)
    params = sharding.shard_state(params0, mesh)
    offloader = RefOffloader(shape == (2, 2, 2), mesh)  # host-memory reference on one mesh
    ref = offloader.park(sharding.shard_state(ref0, mesh))
    opt_state, opt_sh = init_opt_state(optimizer, params, mesh)
    param_sh = jax.tree.map(lambda x: x.sharding, params)
    replicated = NamedSharding(mesh, PartitionSpec())
    step = jax.jit(make_train_step(graphdef, optimizer, loss_cfg, **STEP_ARGS), donate_argnums=(0, 1),
                   out_shardings=(param_sh, opt_sh, replicated))
    ref_fn = jax.jit(make_logprob_fn(graphdef, temperature=TEMPERATURE, chunk_size=4, micro_batch_size=4))

    tokens = sampler.generate(params, prompts, key)
    # Rows of the sampler's KV cache on each device (the batch of 8 prompts split over data * fsdp).
    cache_rows = sampler.last_cache_sharding.shard_shape((len(prompts), CFG.num_kv_heads, 1, CFG.head_dim))[0]
    result, arrays = {}, {"sample_logp": tokens.logp_BxC}
    if shape == (2, 2, 2):  # the mesh that splits rows over data and fsdp and kv heads over tensor at once
      # Groups sharing one prefill per prompt (repeats=2) sample what the prompts repeated in full would.
      grouped = sampler.generate(params, prompts, key, repeats=2)
      repeated = sampler.generate(params, [p for p in prompts for _ in range(2)], key)
      in_segments = segmented.generate(params, prompts, key)
      result = dict(
          segmented_cache_rows=segmented.last_cache_sharding.shard_shape((len(prompts), CFG.num_kv_heads, 1,
                                                                          CFG.head_dim))[0],
          segmented_equal=bool(np.array_equal(in_segments.completion_BxC, tokens.completion_BxC)),
          grouped_equal=bool(np.array_equal(grouped.completion_BxC, repeated.completion_BxC)
                             and np.array_equal(grouped.prompt_BxP, repeated.prompt_BxP)))
      arrays.update(segmented_logp=in_segments.logp_BxC, grouped_logp=grouped.logp_BxC,
                    repeated_logp=repeated.logp_BxC)
    batch = BatchPlacer(mesh)(batch_np)
    batch_layout = _layout(batch._replace(ref_logp_BxC=None))
    batch = batch._replace(ref_logp_BxC=ref_fn(offloader.fetch(ref), batch))
    layout = dict(params=_layout(params), opt_state=_layout(opt_state), ref_params=_layout(ref),
                  batch=batch_layout)
    params, opt_state, metrics = step(params, opt_state, batch)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    result.update(metrics=metrics, layout=layout, sampler_cache_rows=cache_rows, param_shardings_kept=all(
        x.sharding == s for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(param_sh))))
    np.savez(f"{tmp}/{'x'.join(map(str, shape))}.npz", **arrays, **{f"params{k}": v for k, v in _flat(params).items()},
             **{f"opt_state{k}": v for k, v in _flat(opt_state).items()})
    values = dict(tokens=tokens)
    if base is None:
      base = values
      result["moved"] = _max_diff(_host(params), _host(params0))
    else:
      result["tokens_equal"] = bool(np.array_equal(tokens.completion_BxC, base["tokens"].completion_BxC) and
                                    np.array_equal(tokens.completion_mask_BxC, base["tokens"].completion_mask_BxC))
    out[str(shape)] = result

    if shape == (2, 2, 2):  # save on this mesh (reference in host memory) ...
      ckpt = Checkpointer(f"{tmp}/ckpt", keep=2)
      saved = {"params": params, "opt_state": opt_state, "ref_params": ref}
      ckpt.save(1, saved, {"step": 1})
      ckpt.close()
      saved = dict(values=_host(saved), layout=_layout(saved))

  # ... and restore onto (8,1,1), (1,2,4) and one device, each with its own shardings as the target.
  restores = {}
  for shape in [(8, 1, 1), (1, 2, 4), (1, 1, 1)]:
    devices = jax.devices()[:1] if shape == (1, 1, 1) else None
    mesh = sharding.make_mesh(*shape, devices=devices)
    # The target as the loop builds it: shapes, dtypes and this mesh's shardings (nothing computed).
    param_sh = sharding.param_shardings(params0, mesh)
    opt_abstract = jax.eval_shape(optimizer.init, params0)
    opt_sh = opt_state_shardings(opt_abstract, jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params0, param_sh), mesh)
    spec = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    target = abstract = {"params": jax.tree.map(spec, params0, param_sh),
                         "opt_state": jax.tree.map(spec, opt_abstract, opt_sh),
                         "ref_params": jax.tree.map(spec, ref0, param_sh)}
    ckpt = Checkpointer(f"{tmp}/ckpt", keep=2)
    restored = ckpt.restore_latest(abstract)
    ckpt.close()
    restores[str(shape)] = dict(
        step=restored.step, max_diff=_max_diff(_host(restored.state), saved["values"]),
        shardings_match=all(x.sharding == t.sharding for x, t in zip(jax.tree.leaves(restored.state),
                                                                     jax.tree.leaves(target))),
        layout=_layout(restored.state))
  out["restores"] = restores
  out["saved_layout"] = saved["layout"]
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])
