"""Checkpoints of a run (orbax-checkpoint `CheckpointManager`), with fallback past a damaged latest one.

A checkpoint holds two items: `state` (a pytree of arrays: parameters, optimizer state, and the reference
parameters when beta > 0) and `meta` (JSON: step, data position, RNG seed and key data, the config, the
held-out accuracy before training, elapsed time, and a fingerprint of the state's bytes).

Saving is asynchronous by default (`checkpoint.async_save`): `save` returns once orbax holds host copies of
the arrays, and the files are written in a background thread while training goes on; the next save, a
restore and `close` wait for it. The fingerprint (`state_fingerprint`) is computed on the devices where the
arrays live, so neither the save nor the check on restore copies the state to the host for hashing.

Safety: orbax writes each checkpoint into a temporary directory and renames it when complete, and deletes
checkpoints beyond `keep` only after a newer one has been finalized, so an interrupted save never touches
the previous checkpoints. A save that fails in the background (a full disk) is reported by `check`, which
the loop calls every step, so the run stops within a step of it instead of training on without checkpoints
(CheckpointSaveError: one line, the history kept; freeing the space and running again resumes). On restore
the newest checkpoint is tried first; if it cannot be read, or its bytes do not match the stored fingerprint
(grpo_jax/persist/fingerprint.py), a warning is issued, it is moved aside to `<dir>_damaged/`, and the
next older one is tried.
"""
from __future__ import annotations

import contextlib
import logging
import re
import warnings
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp

from grpo_jax import storage
from grpo_jax.errors import CheckpointSaveError
from grpo_jax.persist.fingerprint import state_fingerprint
from grpo_jax.persist.layout import committed_steps, damaged_dir

logger = logging.getLogger(__name__)


def abstract_like(tree):
  """`tree` as a restore target: each array's shape, dtype and sharding, no data."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class Restored(NamedTuple):
  step: int
  state: Any
  meta: dict
  pending: Any = None  # the arrays of rollouts sampled ahead (a dict of numpy arrays), when the checkpoint has them


def _check_fingerprint(state, meta: dict) -> None:
  """Raises ValueError if `state` does not match the fingerprint stored in `meta` at save time; a checkpoint
  without one passes."""
  if "state_fingerprint" in meta and state_fingerprint(state) != meta["state_fingerprint"]:
    raise ValueError("the state's fingerprint does not match the one stored at save time")


class Checkpointer:
  """Saves checkpoints, asynchronously with `async_save` (a run killed mid-save loses only that save)."""

  def __init__(self, directory: str, keep: int, verify: bool = True, async_save: bool = True):
    self.directory, self.verify, self.async_save = storage.absolute(directory), verify, async_save
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
                                           cleanup_tmp_directories=True, **storage.orbax_options(self.directory))
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta", "pending"))

  def all_steps(self) -> list[int]:
    self.wait()
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, meta: dict, pending=None) -> None:
    """Starts writing checkpoint `step`; returns when the arrays may change (donated, updated in place),
    before the files are written when `async_save`. A save still running is finished first. `pending`: host
    arrays of rollouts sampled ahead (a pytree of numpy arrays), or None."""
    meta = dict(meta, step=int(step))
    if self.verify:
      meta["state_fingerprint"] = state_fingerprint(state)
      if pending:
        meta["pending_fingerprint"] = state_fingerprint(pending)
    items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
    if pending:
      items["pending"] = ocp.args.StandardSave(pending)
    with self._save_errors():
      self._manager.save(step, args=ocp.args.Composite(**items), force=True)
      if not self.async_save:
        self._manager.wait_until_finished()

  def wait(self) -> None:
    """Blocks until the last save is on disk and committed."""
    with self._save_errors():
      self._manager.wait_until_finished()

  def check(self) -> None:
    """Raises CheckpointSaveError if the last background save has failed; returns at once otherwise (while a
    save is running too). orbax's own `check_for_errors` misses a failed write: the finalize thread holds it."""
    if not self._manager.is_saving_in_progress():
      self.wait()  # nothing left to wait for: returns at once, or raises the save's error

  @contextlib.contextmanager
  def _save_errors(self):
    """A write the operating system refused (ENOSPC, EFBIG, a lost mount) as one CheckpointSaveError; any other
    error (a bug) raises as it is."""
    try:
      yield
    except Exception as e:
      reason = _os_failure_reason(e)
      if reason is None:
        raise
      raise CheckpointSaveError(
          f"writing a checkpoint to {self.directory} failed ({reason}); the run stopped with its history and "
          "earlier checkpoints kept: free disk space there (`df -h`) and run the same command again to resume") from e

  def restore_latest(self, abstract_state) -> Restored | None:
    """The newest readable checkpoint restored into `abstract_state`'s structure, or None if there is none."""
    for step in reversed(self.all_steps()):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        state, meta = restored["state"], dict(restored["meta"])
        if self.verify:
          _check_fingerprint(state, meta)
        if int(meta.get("step", -1)) != step:
          raise ValueError(f"meta.step={meta.get('step')} differs from the directory's step {step}")
        pending = None
        if "pending_fingerprint" in meta or meta.get("pending"):
          pending = self._manager.restore(step, args=ocp.args.Composite(pending=ocp.args.StandardRestore()))[
              "pending"]
          if self.verify and state_fingerprint(pending) != meta.get("pending_fingerprint"):
            raise ValueError("the pending rollouts' fingerprint does not match the one stored at save time")
        return Restored(step, state, meta, pending)
      except Exception as e:  # any read failure means this checkpoint is unusable: fall back.
        self._set_aside(step, e)
    return None

  def _set_aside(self, step: int, error: Exception) -> None:
    src = storage.join(self.directory, str(step))
    dst_dir = damaged_dir(self.directory)
    storage.makedirs(dst_dir)
    dst = storage.join(dst_dir, str(step))
    for copy in range(1, 1000):  # never delete an earlier damaged copy of the same step
      if not storage.exists(dst):
        break
      dst = storage.join(dst_dir, f"{step}.{copy}")
    message = (f"checkpoint at step {step} in {self.directory} is unreadable or corrupt "
               f"({type(error).__name__}: {str(error)[:300]}); moved it to {dst} and falling back to the "
               "previous checkpoint")
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    logger.warning(message)
    if storage.exists(src):
      storage.move_tree(src, dst)
    self._manager.reload()  # re-read the list of steps

  def close(self):
    try:
      self.wait()
    finally:
      self._manager.close()


def _os_failure_reason(error: Exception) -> str | None:
  """The operating system's words for a failed write ("No space left on device"): from an OSError, or from the
  `[os_error_code=...]` that tensorstore puts in orbax's message. None for any other error."""
  if isinstance(error, OSError):
    return error.strerror or str(error)
  match = re.search(r":\s*([^:]+?)\s*\[os_error_code='\d+'\]", str(error))
  return match.group(1) if match else None


def restore_params(directory: str, step: int, abstract_params, verify: bool = True,
                   item: str = "params") -> tuple[Any, dict]:
  """(params, meta) of checkpoint `step` in another run's `directory`, opened read-only (nothing there is
  moved, cleaned or rotated, even while that run is still writing). Only `state[item]` is read ("params", or a
  LoRA run's "adapters"), so the checkpoint may hold more (optimizer state, a reference model). The checksum is
  checked when the checkpoint holds nothing but the parameters (a warm-start directory); a full checkpoint's
  covers state we do not read."""
  directory = storage.absolute(directory)
  options = ocp.CheckpointManagerOptions(read_only=True, create=False, cleanup_tmp_directories=False,
                                         **storage.orbax_options(directory))
  manager = ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))
  try:
    if step not in manager.all_steps():
      raise FileNotFoundError(f"{directory} has no complete checkpoint at step {step} (steps: "
                              f"{sorted(manager.all_steps())})")
    target = {item: abstract_params}
    restore_args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), target)
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
        meta=ocp.args.JsonRestore()))
  finally:
    manager.close()
  state, meta = restored["state"], dict(restored["meta"])
  # A partial restore leaves what the checkpoint does not hold as the abstract target: refuse it by name.
  missing = [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_flatten_with_path(state[item])[0]
             if isinstance(x, jax.ShapeDtypeStruct)]
  if missing:
    raise ValueError(f"{directory} (step {step}) holds no {item}{missing[0]} ({len(missing)} of the arrays "
                     "asked for are missing)" + (
                         "; it is a LoRA run's checkpoint, which holds the adapters alone: the run's starting point "
                         "is its saved one (after a warm start), else the base model its config builds"
                         if _holds_adapters(directory, step) else ""))
  if verify and meta.get("params_only"):
    try:
      _check_fingerprint(state, meta)
    except ValueError as e:
      raise ValueError(f"the parameters in {directory} (step {step}): {e}") from None
  return state[item], meta


def _holds_adapters(directory: str, step: int) -> bool:
  """Whether checkpoint `step` in `directory` is a LoRA run's (its array tree, as orbax's metadata of it says,
  has an "adapters" branch)."""
  from etils import epath
  try:
    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(storage.join(directory, str(step), "state"))).tree
  except (FileNotFoundError, OSError, ValueError):
    return False
  return "adapters" in tree


def save_initial_state(directory: str, params, meta: dict, verify: bool = True) -> None:
  """Saves `params` alone as step 0 of `directory` (read back by `restore_params`); meta must be JSON."""
  checkpointer = Checkpointer(directory, keep=1, verify=verify)
  try:
    checkpointer.save(0, {"params": params}, dict(meta, params_only=True))
  finally:
    checkpointer.close()


def lora_base_fingerprint(base_params) -> str:
  """What a LoRA run's checkpoints store of their frozen base (`lora_base_fingerprint` in the meta)."""
  return state_fingerprint({"params": base_params})


def restore_lora_base(start: str, initial_base, fingerprint: str | None):
  """The frozen base model of a LoRA run, whose checkpoints hold the adapters alone: the run's saved starting
  point (the orbax directory `start`, written after a warm start or from warmstart.init_checkpoint) when it has
  one, else `initial_base` (the base its config builds: the Hugging Face checkpoint, or the seed's
  initialization). ValueError when it is not the base the checkpoints were trained on (`fingerprint`)."""
  base, source = initial_base, "the model its config builds"
  if 0 in committed_steps(start):
    base, source = restore_params(start, 0, abstract_like(initial_base))[0], start
  if fingerprint is not None and lora_base_fingerprint(base) != fingerprint:
    raise ValueError(f"the LoRA run's checkpoints hold the adapters alone, and the base model read from {source} "
                     "is not the one they were trained on (fingerprint mismatch: were model.hf_path's files or "
                     f"{start} changed?)")
  return base
