"""A fingerprint of a training state, computed where its arrays live: what a checkpoint stores to tell, on
restore, that the bytes read back are the bytes saved (grpo_jax/persist/checkpoint.py) and what the recorded CPU
fingerprints of tests/train/ compare.

Each array is read as uint32 words (8-byte items and PRNG keys as two), and two wrap-around sums are taken on
its devices, of the words weighted by (2 i + 1) and by (2 i + 1) * 0x9E3779B1 (i the flat index), so that a
changed or moved value changes the pair (except with probability ~2^-32 per sum); only these 8 bytes per array
are copied to the host, where SHA-256 hashes them with the key paths, dtypes and shapes. Integer sums are exact in
any order, so each shard is summed on its own device and the parts added up, whatever the sharding; multi-host,
each process sums the shards it holds, and one gather adds them up.
"""
from __future__ import annotations

import hashlib
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

_FINGERPRINT_MULTIPLIER = 0x9E3779B1  # odd: multiplying by it permutes uint32, so no bit pattern is lost


def _words_per_element(x) -> int:
  """How many uint32 words one element's bit pattern is read as: 2 for 8-byte items and for PRNG keys of
  two uint32 words each (threefry), 1 otherwise (bool, 1-, 2- and 4-byte items are widened to one word)."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    return math.prod(jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), x.dtype)).shape)
  return 2 if x.dtype.itemsize == 8 else 1


def _shard_sums(x, first_word, word_strides: tuple[int, ...]) -> jax.Array:
  """uint32[2]: one shard's part of its array's two sums. Word `l` of the shard (index into x.shape + (k,),
  k = `_words_per_element`) is word `first_word + sum_d l_d * word_strides[d]` of the whole array read flat;
  the strides are the whole array's row-major ones, so the parts of disjoint shards add up to the whole's."""
  ndim = x.ndim
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)  # a trailing axis of the key's words
  bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  u = jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32)  # 8-byte items gain a trailing axis of 2
  u = u.reshape(u.shape[:ndim] + (math.prod(u.shape[ndim:]),))
  index = jnp.asarray(first_word, jnp.uint32)
  for axis, stride in enumerate(word_strides):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, u.shape, axis) * jnp.uint32(stride)
  odd = index * jnp.uint32(2) + jnp.uint32(1)
  return jnp.stack([jnp.sum(u * odd, dtype=jnp.uint32),
                    jnp.sum(u * (odd * jnp.uint32(_FINGERPRINT_MULTIPLIER)), dtype=jnp.uint32)])


# One program per shard shape, dtype and strides (a few dozen for a transformer), dispatched shard by shard: a
# single program over every array of a state compiled more slowly (benchmarks/README.md, "Figures behind code
# choices").
_jitted_shard_sums = jax.jit(_shard_sums, static_argnums=2)


def _shard_parts(x) -> list[jax.Array]:
  """uint32[2] per distinct shard of `x` (replica 0 of each index), each computed on its own device with no
  collective. A program per array over a sharded array runs all-reduces and all-gathers, and many of them in
  flight at once deadlocked XLA's CPU devices (8 virtual devices, arrays arriving from a restore)."""
  if not isinstance(x, jax.Array):
    if jax.process_index() != 0:  # a host value every process holds whole: counted once, by process 0
      return []
    x = jnp.asarray(x)
  k = _words_per_element(x)
  strides = [k] * (x.ndim + 1)  # row-major strides, in words, of the array read as x.shape + (k,)
  strides[x.ndim] = 1
  for d in range(x.ndim - 1, 0, -1):
    strides[d - 1] = strides[d] * x.shape[d]
  wrap = lambda n: n % (1 << 32)  # uint32 arithmetic wraps: arrays of more than 2^32 words stay exact
  parts = []
  for shard in x.addressable_shards:
    if shard.replica_id != 0:
      continue
    first = sum((sl.start or 0) * stride for sl, stride in zip(shard.index, strides))
    parts.append(_jitted_shard_sums(_on_its_device(_in_device_memory(shard.data)), np.uint32(wrap(first)),
                                    tuple(wrap(s) for s in strides)))
  return parts


def _combine(parts) -> np.ndarray:
  """The uint32[2] sum, wrapping, of one array's shard parts (host values; none: zeros)."""
  return np.sum(np.asarray(parts, np.uint32).reshape(-1, 2), axis=0, dtype=np.uint32)


def _on_its_device(shard_data: jax.Array) -> jax.Array:
  """The same buffer under a SingleDeviceSharding (no copy). A shard of an array on a one-device mesh keeps the
  mesh's NamedSharding, and jit compiles a program per input sharding: without this, a run's digests compiled
  each shape twice (the parameters on the mesh, the rest on the default device)."""
  device = next(iter(shard_data.sharding.device_set))
  return jax.device_put(shard_data, jax.sharding.SingleDeviceSharding(device))


def _in_device_memory(leaf):
  """`leaf`, copied to device memory when it lives in host memory (an offloaded reference model): XLA computes
  on device memory only. One array at a time, so the copy never holds more than the largest array."""
  sharding = getattr(leaf, "sharding", None)
  kind = getattr(sharding, "memory_kind", None)
  if kind is None:
    return leaf
  default = next(iter(sharding.device_set)).default_memory().kind
  return leaf if kind == default else jax.device_put(leaf, sharding.with_memory_kind(default))


def state_fingerprint(state) -> str:
  """A hex digest of the state's arrays: SHA-256 over the key paths, dtypes and shapes and each array's two sums
  (8 bytes per array, the only thing copied to the host). On an accelerator it reads the state at memory
  bandwidth where it lives, instead of copying it to the host and hashing it there; on the 2-core CPU both read
  host memory and take about as long (2.7 vs 2.9 s for 1.84 GiB, benchmarks/README.md)."""
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  sums = np.array([_combine(parts) for parts in jax.device_get([_shard_parts(leaf) for _, leaf in flat])],
                  np.uint32).reshape(-1, 2)
  if jax.process_count() > 1:  # each process summed the shards it holds: one gather adds up the processes'
    sums = np.sum(multihost_utils.process_allgather(sums), axis=0, dtype=np.uint32)
  h = hashlib.sha256()
  for (path, leaf), pair in zip(flat, sums):
    h.update(jax.tree_util.keystr(path).encode())
    h.update(f"{leaf.dtype}{tuple(np.shape(leaf))}".encode())
    h.update(pair.astype("<u4").tobytes())
  return h.hexdigest()
