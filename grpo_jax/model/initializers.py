"""Parameter initialization shared by the model's modules (transformer.py, moe.py)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


def normal(stddev: float):
  """N(0, stddev²) initializer. Drawn as a flat vector and reshaped: XLA:CPU compiles the 1-D threefry program
  several times faster than an N-D one, and eager model construction compiles one per parameter shape."""
  def init(key, shape, dtype):
    return (stddev * jax.random.normal(key, (math.prod(shape),), jnp.float32)).astype(dtype).reshape(shape)
  return init


def zeros(key, shape, dtype):
  del key
  return jnp.zeros(shape, dtype)


def param(rngs: nnx.Rngs, init, shape, names, dtype):
  """An nnx.Param of `shape` whose dimensions carry the logical axis `names` (grpo_jax/model/sharding.py)."""
  return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=names, eager_sharding=False)
