"""Worker of test_moe.py's expert-parallel test, on 4 virtual CPU devices: a Qwen3-MoE checkpoint's logits and one
gradient step with its expert weights split over 1, 2 and 4 'expert' shards (argv: checkpoint directory)."""
from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax.model import causal_attention_mask, hf_io, positions_from_mask, token_logprobs
from grpo_jax.model import sharding as sharding_lib


def main(path: str):
  jax.config.update("jax_default_matmul_precision", "highest")
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 96, size=(8, 12)).astype(np.int32)
  mask = np.arange(12)[None] >= rng.integers(0, 6, size=8)[:, None]
  tokens = np.where(mask, tokens, 0)
  out = {}
  for expert in (1, 2, 4):
    mesh = sharding_lib.make_mesh(data=-1, expert=expert)
    model = hf_io.from_pretrained(path, mesh=mesh)
    graphdef, state = nnx.split(model)
    rows = NamedSharding(mesh, PartitionSpec(sharding_lib.batch_axes(mesh)))
    t, m = jax.device_put(tokens, rows), jax.device_put(mask, rows)

    def loss_fn(state, t, m):
      model = nnx.merge(graphdef, state)
      hidden, _ = model(t, positions_from_mask(m), causal_attention_mask(m))
      logp, _ = token_logprobs(hidden[:, :-1], model.output_matrix_DxV(), t[:, 1:])
      return -jnp.sum(logp * m[:, 1:]) / jnp.sum(m[:, 1:]), model.logits(hidden)

    @jax.jit
    def step(state, t, m):
      (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state, t, m)
      return loss, logits, jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)

    loss, logits, new = step(state, t, m)
    gate = new["layers"][1]["mlp"]["gate_ExDxF"].get_value()  # decoder_sparse_step 2: layers 1 and 3
    out[expert] = dict(loss=float(loss), logits=np.asarray(logits)[mask].tolist(),
                       params=np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(new)]).tolist(),
                       gate_shard=list(gate.addressable_shards[0].data.shape), gate_spec=str(gate.sharding.spec))
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])
