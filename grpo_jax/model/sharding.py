"""Logical-axis sharding: one table maps the model's logical axis names to the mesh axes.

Mesh axes: 'data' (pure data parallelism: parameters replicated), 'fsdp' (data parallelism with parameters,
gradients and optimizer state sharded along their 'embed' dimension), 'tensor' (Megatron-style tensor
parallelism over heads, MLP hidden units and the vocabulary). Any of them may have size 1. A mixture of experts
adds 'expert' (present only when its size is > 1): expert weights are split by expert over it, and it splits the
batch too, so that attention and the dense layers stay data parallel there.

Parameters carry their logical names as `nnx.Param(..., out_sharding=(names...))` (see transformer.py);
activations use 'batch' and 'length'. A dimension whose size does not divide the size of its mesh axes is
replicated instead (e.g. 2 kv heads on a tensor axis of 4), and a mesh axis is used at most once per array.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis, tuple of mesh axes, or None (replicated).
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    # activations
    ("batch", ("data", "fsdp", "expert")),
    ("length", None),
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert", "expert"),
    ("norm", None),
)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None,
              expert: int = 1) -> jax.sharding.Mesh:
  """A ('data', 'fsdp', 'tensor') mesh over `devices` (default: all), and a fourth axis 'expert' when expert > 1;
  data=-1 takes the remaining devices."""
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  for name, size in (("fsdp", fsdp), ("tensor", tensor), ("expert", expert)):
    if size < 1:
      raise ValueError(f"make_mesh: {name}={size} must be >= 1")
  others = fsdp * tensor * expert
  if data == -1:
    if n % others:
      raise ValueError(f"make_mesh: {n} devices are not divisible by fsdp*tensor*expert={others}")
    data = n // others
  if data < 1 or data * others != n:
    raise ValueError(f"make_mesh: data*fsdp*tensor*expert={data}*{fsdp}*{tensor}*{expert} != {n} devices")
  # Auto axes: the computation is written without per-op sharding annotations; shardings are given at jit
  # boundaries (and by the parameters) and XLA propagates them. A mesh without experts keeps three axes.
  shape, names = ((data, fsdp, tensor, expert), MESH_AXES + ("expert",)) if expert > 1 else ((data, fsdp, tensor),
                                                                                            MESH_AXES)
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices)


def batch_axes(mesh: jax.sharding.Mesh) -> tuple[str, ...]:
  """The mesh axes that split a batch's rows ('batch' rule's axes present in `mesh`)."""
  return tuple(a for a in _mesh_axes_tuple(dict(LOGICAL_RULES)["batch"]) if a in mesh.shape)


def _mesh_axes_tuple(entry) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def logical_to_spec(names: Sequence[str | None], mesh: jax.sharding.Mesh, rules=LOGICAL_RULES,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
  """PartitionSpec for an array whose dimensions have logical `names`.

  With `shape`, a dimension not divisible by the product of its mesh axes' sizes is replicated. Mesh axes
  absent from `mesh` are ignored; a mesh axis already used by an earlier dimension is not reused.
  """
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for i, name in enumerate(names):
    if name is not None and name not in table:
      raise ValueError(f"logical axis {name!r} has no sharding rule (rules cover {sorted(table)})")
    axes = tuple(a for a in _mesh_axes_tuple(table.get(name)) if a in mesh.shape and a not in used)
    size = math.prod(mesh.shape[a] for a in axes)
    if not axes or (shape is not None and shape[i] % size):
      spec.append(None)
      continue
    used.update(axes)
    spec.append(axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)


def param_shardings(state, mesh: jax.sharding.Mesh, rules=LOGICAL_RULES):
  """The state's pytree with each Variable's value replaced by its NamedSharding.

  Works on concrete or abstract (`nnx.eval_shape`) state; a Variable without `out_sharding` metadata is
  replicated. The result can be given to `jax.device_put`, or as `jax.jit` in/out shardings of that state.
  """
  if rules is None:
    rules = LOGICAL_RULES

  def one(v: nnx.Variable):
    shape = np.shape(v.get_value())
    names = v.get_metadata().get("out_sharding") or (None,) * len(shape)
    if len(names) != len(shape):
      raise ValueError(f"out_sharding {names} has {len(names)} names for a value of shape {shape}")
    return v.replace(NamedSharding(mesh, logical_to_spec(names, mesh, rules, shape)))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_state(state, mesh: jax.sharding.Mesh, rules=LOGICAL_RULES):
  """Places every array of `state` on its sharding from `param_shardings`."""
  return jax.device_put(state, param_shardings(state, mesh, rules))
