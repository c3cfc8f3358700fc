"""Run by test_sharding.py in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8.

Prints one JSON object: per mesh shape and per way of sharding (shard_state on a live model, from_pretrained
with a mesh), each parameter's PartitionSpec and per-device shard shapes, plus the max |logits difference| of
a jitted forward pass on the sharded parameters vs the same pass on one device.
"""
from __future__ import annotations

import json
import sys

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load_file

from grpo_jax.model import (ModelConfig, Transformer, causal_attention_mask, hf_io, positions_from_mask,
                            sharding)

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                  num_kv_heads=2, head_dim=8, qk_norm=True, family="qwen3")
MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]


def _spec(spec) -> list:
  return [list(s) if isinstance(s, tuple) else s for s in spec]


def main(checkpoint_dir: str):
  assert jax.device_count() == 8, jax.devices()
  model = Transformer(CFG, rngs=nnx.Rngs(0))
  hf_io.save_pretrained(model, checkpoint_dir)
  graphdef, state = nnx.split(model)
  mask = np.arange(8)[None] >= np.array([[0], [3], [5], [1]])
  tokens = np.where(mask, np.random.default_rng(0).integers(1, 64, size=mask.shape), 0).astype(np.int32)

  @jax.jit
  def logits(state):
    m = nnx.merge(graphdef, state)
    return m.logits(m(tokens, positions_from_mask(mask), causal_attention_mask(mask))[0])

  reference = np.asarray(logits(state))
  abstract = nnx.split(nnx.eval_shape(lambda: Transformer(CFG, rngs=nnx.Rngs(0))))[1]
  out = {}
  for shape in MESHES:
    mesh = sharding.make_mesh(*shape)
    abstract_specs = {".".join(map(str, p)): _spec(v.get_value().spec)
                      for p, v in nnx.to_flat_state(sharding.param_shardings(abstract, mesh))}
    for how in ("shard_state", "from_pretrained"):
      if how == "shard_state":
        sharded = sharding.shard_state(state, mesh)
      else:
        loaded = hf_io.from_pretrained(checkpoint_dir, mesh=mesh)
        sharded = nnx.state(loaded)
        if shape == (2, 2, 2):  # saving gathers the shards back into the same tensors
          resaved = f"{checkpoint_dir}/resaved"
          hf_io.save_pretrained(loaded, resaved)
          a, b = load_file(f"{checkpoint_dir}/model.safetensors"), load_file(f"{resaved}/model.safetensors")
          out["resave_equal"] = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
      params = {}
      for p, v in nnx.to_flat_state(sharded):
        x = v.get_value()
        name = ".".join(map(str, p))
        assert _spec(x.sharding.spec) == abstract_specs[name], name
        params[name] = dict(spec=_spec(x.sharding.spec),
                            shard_shapes=sorted({tuple(s.data.shape) for s in x.addressable_shards}),
                            devices=len(x.addressable_shards))
      out[f"{shape}/{how}"] = dict(params=params, logits_diff=float(np.abs(np.asarray(logits(sharded)) -
                                                                            reference).max()))
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])
