"""Checkpoints of a run (orbax-checkpoint `CheckpointManager`), with fallback past a damaged latest one.

A checkpoint holds two items: `state` (a pytree of arrays: parameters, optimizer state, and the reference
parameters when beta > 0) and `meta` (JSON: step, data position, RNG seed and key data, the config, the
held-out accuracy before training, elapsed time, and a SHA-256 of the state's bytes).

Safety: orbax writes each checkpoint into a temporary directory and renames it when complete, and deletes
checkpoints beyond `keep` only after a newer one has been finalized, so an interrupted save never touches
the previous checkpoints. On restore the newest checkpoint is tried first; if it cannot be read, or its
bytes do not match the stored checksum, a warning is issued, it is moved aside to `<dir>_damaged/`, and
the next older one is tried.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"  # WORKDIR/checkpoints/STEP


class Restored(NamedTuple):
  step: int
  state: Any
  meta: dict


def state_checksum(state) -> str:
  """SHA-256 over the leaves' key paths, dtypes, shapes and bytes (host copies)."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:  # multi-host: a collective gather
      leaf = multihost_utils.process_allgather(leaf, tiled=True)
    arr = np.asarray(jax.device_get(leaf))
    h.update(jax.tree_util.keystr(path).encode())
    h.update(f"{arr.dtype}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
  return h.hexdigest()


class Checkpointer:
  """Saves every checkpoint synchronously (small states; a run killed mid-save loses only that save)."""

  def __init__(self, directory: str, keep: int, verify: bool = True):
    self.directory = os.path.abspath(directory)
    self.keep = keep
    self.verify = verify
    self._manager = self._make_manager()

  def _make_manager(self):
    options = ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True,
                                           enable_async_checkpointing=False,
                                           cleanup_tmp_directories=True)
    return ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, meta: dict) -> None:
    meta = dict(meta, step=int(step))
    if self.verify:
      meta["state_sha256"] = state_checksum(state)
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def restore_latest(self, abstract_state) -> Restored | None:
    """The newest readable checkpoint restored into `abstract_state`'s structure, or None if there is none."""
    for step in reversed(self.all_steps()):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        state, meta = restored["state"], dict(restored["meta"])
        if self.verify and "state_sha256" in meta and state_checksum(state) != meta["state_sha256"]:
          raise ValueError("the parameters' checksum does not match the one stored at save time")
        if int(meta.get("step", -1)) != step:
          raise ValueError(f"meta.step={meta.get('step')} differs from the directory's step {step}")
        return Restored(step, state, meta)
      except Exception as e:  # any read failure means this checkpoint is unusable: fall back.
        self._set_aside(step, e)
    return None

  def _set_aside(self, step: int, error: Exception) -> None:
    src = os.path.join(self.directory, str(step))
    dst_dir = self.directory.rstrip("/") + "_damaged"
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, str(step))
    for copy in range(1, 1000):  # never delete an earlier damaged copy of the same step
      if not os.path.exists(dst):
        break
      dst = os.path.join(dst_dir, f"{step}.{copy}")
    message = (f"checkpoint at step {step} in {self.directory} is unreadable or corrupt "
               f"({type(error).__name__}: {str(error)[:300]}); moved it to {dst} and falling back to the "
               "previous checkpoint")
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    logger.warning(message)
    if os.path.exists(src):
      shutil.move(src, dst)
    self._manager.reload()  # re-read the list of steps

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()


def restore_params(directory: str, step: int, abstract_params, verify: bool = True) -> tuple[Any, dict]:
  """(params, meta) of checkpoint `step` in another run's `directory`, opened read-only (nothing there is
  moved, cleaned or rotated, even while that run is still writing). Only `state["params"]` is read, so the
  checkpoint may hold more (optimizer state, a reference model). The checksum is checked when the checkpoint
  holds nothing but the parameters (a warm-start directory); a full checkpoint's covers state we do not read."""
  options = ocp.CheckpointManagerOptions(read_only=True, create=False, cleanup_tmp_directories=False)
  manager = ocp.CheckpointManager(os.path.abspath(directory), options=options, item_names=("state", "meta"))
  try:
    if step not in manager.all_steps():
      raise FileNotFoundError(f"{directory} has no complete checkpoint at step {step} (steps: "
                              f"{sorted(manager.all_steps())})")
    target = {"params": abstract_params}
    restore_args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), target)
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
        meta=ocp.args.JsonRestore()))
  finally:
    manager.close()
  state, meta = restored["state"], dict(restored["meta"])
  if verify and meta.get("params_only") and "state_sha256" in meta and state_checksum(state) != meta["state_sha256"]:
    raise ValueError(f"the parameters in {directory} (step {step}) do not match the checksum stored at save time")
  return state["params"], meta


def save_initial_state(directory: str, params, meta: dict, verify: bool = True) -> None:
  """Saves `params` alone as step 0 of `directory` (read back by `restore_params`); meta must be JSON."""
  checkpointer = Checkpointer(directory, keep=1, verify=verify)
  try:
    checkpointer.save(0, {"params": params}, dict(meta, params_only=True))
  finally:
    checkpointer.close()
