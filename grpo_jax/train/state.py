"""Optimizer state placed like the parameters it mirrors, so jitted updates keep fixed shardings.

Optax initializes moments with `zeros_like(params)`; under jit those zeros do not depend on the inputs, so
they come back uncommitted on one device. A jitted update that donates them would then see different input
shardings on its first and second call and compile twice. Here every optimizer-state leaf that mirrors a
parameter (same key-path suffix and shape) gets that parameter's sharding; the rest (step counts) are
replicated over the mesh.
"""
from __future__ import annotations

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec


def _path_keys(path) -> tuple:
  return tuple(str(k) for k in path)


def opt_state_shardings(opt_state, params, mesh):
  by_path = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    by_path[_path_keys(path)] = (leaf.shape, leaf.sharding)
  lengths = sorted({len(k) for k in by_path})
  replicated = NamedSharding(mesh, PartitionSpec())

  def one(path, leaf):
    keys = _path_keys(path)
    for n in lengths:
      hit = by_path.get(keys[-n:]) if len(keys) >= n else None
      if hit is not None and hit[0] == leaf.shape:
        return hit[1]
    return replicated

  return jax.tree_util.tree_map_with_path(one, opt_state)


def init_opt_state(optimizer: optax.GradientTransformation, params, mesh):
  """(opt_state, its shardings): optimizer.init(params) with every leaf committed to its sharding."""
  abstract = jax.eval_shape(optimizer.init, params)
  shardings = opt_state_shardings(abstract, params, mesh)
  return jax.jit(optimizer.init, out_shardings=shardings)(params), shardings
