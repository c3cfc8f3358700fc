"""Reference parameters parked in host memory between uses (`config.model.offload_ref_params`).

The reference policy is read once per GRPO step (its log-probs of the rollout batch). Between reads its
parameters can sit in the accelerator host's pinned memory: `park` moves them there (same sharding, memory kind
`pinned_host`), `fetch` copies them back to device memory for the reference forward pass, and the device copy
is dropped right after. This frees one model's worth of accelerator memory per device at the cost of one
host->device transfer per step. Where the backend has no `pinned_host` memory, both are the identity (logged
once).
"""
from __future__ import annotations

import logging

import jax

logger = logging.getLogger(__name__)

HOST_MEMORY = "pinned_host"


def host_memory_supported(mesh) -> bool:
  """True if every device of `mesh` (this process's ones) exposes `pinned_host` memory."""
  try:
    return all(any(m.kind == HOST_MEMORY for m in d.addressable_memories())
               for d in mesh.devices.flat if d.process_index == jax.process_index())
  except Exception:  # a backend without memory-kind support
    return False


class RefOffloader:
  """`park(tree)` -> the tree in host memory (or unchanged); `fetch(tree)` -> the tree in device memory."""

  def __init__(self, enabled: bool, mesh):
    self.active = bool(enabled) and host_memory_supported(mesh)
    if enabled and not self.active:
      logger.warning("offload_ref_params: this backend has no %r memory; reference parameters stay in device "
                     "memory", HOST_MEMORY)
      print(f"[memory] offload_ref_params: no {HOST_MEMORY!r} memory on this backend; the reference "
            "parameters stay in device memory")

  def park(self, tree):
    if not self.active or tree is None:
      return tree
    return jax.device_put(tree, jax.tree.map(lambda x: x.sharding.with_memory_kind(HOST_MEMORY), tree))

  def fetch(self, tree):
    if not self.active or tree is None:
      return tree
    device = lambda x: x.sharding.with_memory_kind(x.sharding.mesh.devices.flat[0].default_memory().kind)
    return jax.device_put(tree, jax.tree.map(device, tree))
