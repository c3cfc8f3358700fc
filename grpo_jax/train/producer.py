"""The producer: the batches a run learns from, sampled before the update (inline) or on the sampler's own
devices while the update runs (overlapped: `rollout.sampler_devices` > 0).

Batch t is step t's prompts (the training rows from the data position on) sampled with step t's key,
fold_in(key(seed), t), by the policy after max(0, t - 1 - k) updates (k = `rollout.staleness`): the same batch
whoever samples it and whenever. Batches sampled ahead wait in the run state's `pending`, which a checkpoint keeps.
With `rollout.decode_budget` = B, batches span updates (`advance`, grpo_jax/train/partial.py): batch t starts with
that policy and advances B tokens per row with each newer one, up to the policy after t - 1 updates.

Overlapped, every array a sampler program reads lives on the sampler's devices or comes from the host: the
weights, which `sync` copies there after each update (only what trains: a LoRA base is copied once; cast to the
compute dtype, which the forward casts to anyway), the key (made there), and the small programs of a rollout
(group statistics, advantages, DAPO's round keys), which run there under its default device. A GPU or TPU device
runs its programs in order: anything computed on the trainer's devices would make the sampler wait behind the
update just dispatched.

Timing: `take_seconds()` gives what the producer spent since the last call, sampling (timing/sample_s), in the
reward functions (timing/reward_s) and copying weights (timing/sync_s): a step's own seconds, whichever step's
batch they were spent on.
"""
from __future__ import annotations

import collections
import contextlib
import time
from typing import Any, Callable

import jax
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax import errors
from grpo_jax.model import sharding as sharding_lib
from grpo_jax.train import partial
from grpo_jax.train.rollout import Rollout, RolloutSpec, collect_dynamic_rollout, collect_rollout

TIMED = ("timing/sample_s", "timing/reward_s", "timing/sync_s")


def make_meshes(settings) -> tuple[jax.sharding.Mesh, jax.sharding.Mesh | None]:
  """(the trainer's mesh, the sampler's own mesh or None) over this process's devices: the trainer's axes
  (`mesh`) over all but the last `rollout.sampler_devices` = N, the sampler's (N / T data, T tensor; T =
  `rollout.sampler_tensor`) over those. A layout the devices do not allow is a ConfigError of one line, raised
  before anything is built."""
  m, n = settings.mesh, settings.rollout.sampler_devices
  devices = jax.devices()
  if settings.rollout.decode_budget and jax.process_count() > 1:
    raise errors.ConfigError(f"config.rollout.decode_budget={settings.rollout.decode_budget}: rollouts that span "
                             f"updates work in one process (this run has {jax.process_count()}); set it to 0")
  if n and jax.process_count() > 1:
    raise errors.ConfigError(f"config.rollout.sampler_devices={n}: the sampler's own devices work in one process "
                             f"(this run has {jax.process_count()}); set it to 0 (inline rollouts)")
  if n >= len(devices):
    raise errors.ConfigError(f"config.rollout.sampler_devices={n}: leaves no device for the update (there are "
                             f"{len(devices)})")
  trainer = devices[:len(devices) - n]
  try:
    mesh = sharding_lib.make_mesh(data=m.data, fsdp=m.fsdp, tensor=m.tensor, devices=trainer, expert=m.expert)
  except ValueError as e:
    raise errors.ConfigError(f"config.mesh: {e.args[0].removeprefix('make_mesh: ')} (the trainer's devices: "
                             f"{len(trainer)} of {len(devices)}, rollout.sampler_devices={n}); change mesh.* or "
                             "rollout.sampler_devices") from None
  t = settings.rollout.sampler_tensor
  return mesh, sharding_lib.make_mesh(data=n // t, tensor=t, devices=devices[-n:]) if n else None


class Producer:
  """Samples the batches of a run (module docstring). `sync(params, step)` gives the sampler the policy's current
  parameters; `fill(state, step)` returns `state` with the batches the update of `step` needs pending (the first
  is its own), `during_update(step)` what to sample while it runs (overlapped) or None."""

  def __init__(self, settings, task, tokenizer, sampler, rollout_spec: RolloutSpec, policy,
               sampler_mesh, cast: Callable, rows: tuple[int, int], all_true: Callable[[bool], bool]):
    """`sampler_mesh`: the sampler's own devices (None: inline); `cast`: parameters -> the compute dtype; `rows`:
    (offset, count) of this process's prompts in a step's batch; `all_true`: the processes' collective AND."""
    self.settings, self.task, self.tokenizer, self.sampler = settings, task, tokenizer, sampler
    self.rollout_spec, self.policy, self.sampler_mesh, self.cast = rollout_spec, policy, sampler_mesh, cast
    self.offset, self.count = rows
    self.all_true = all_true
    self.staleness, self.decode_budget = settings.rollout.staleness, settings.rollout.decode_budget
    self.slot_counts = _slot_counts(sampler)
    key = jax.random.key(settings.seed)
    self.base_key = key if sampler_mesh is None else jax.device_put(key, NamedSharding(sampler_mesh,
                                                                                        PartitionSpec()))
    self.params = None  # what the sampler reads (`sync`), the policy after `params_step` updates
    self.params_step = 0
    self._then = None  # (params, step) to sync after the next `fill` (`resume_behind`)
    self._frozen = None  # overlapped: the sampler's copy of what never trains (a LoRA base)
    self._seconds = collections.Counter()

  @property
  def overlapped(self) -> bool:
    return self.sampler_mesh is not None

  def take_seconds(self) -> dict[str, float]:
    """The seconds spent since the last call (module docstring), and a fresh count."""
    spent, self._seconds = {k: float(self._seconds[k]) for k in TIMED if k in self._seconds}, collections.Counter()
    return spent

  def sync(self, params, step: int) -> None:
    """Gives the sampler `params`, the policy after `step` updates: themselves inline (read, never donated), else
    a copy on its devices of the trainable part in the compute dtype (device to device), joined with the frozen
    part copied once."""
    self.params_step = step
    if not self.overlapped:
      self.params = params
      return
    t0 = time.perf_counter()
    self._copy_frozen(params)
    trainable = jax.block_until_ready(self._to_sampler(self.policy.trainable_part(params)))
    self.params = self.policy.joined(trainable, self._frozen)
    self._seconds["timing/sync_s"] += time.perf_counter() - t0

  def sampler_leaves(self) -> list:
    """The trainable part of what the sampler reads, as leaves (a checkpoint's copy of it: `resume_behind`)."""
    return jax.tree.leaves(self.policy.trainable_part(self.params))

  def resume_behind(self, leaves: list, step: int, params, params_step: int) -> None:
    """Overlapped, restored from a save during the sampling: the sampler takes back its policy after `step`
    updates (`leaves`, as `sampler_leaves` gave them) for the batches not yet pending, then (after the next
    `fill`) `params`, the policy after `params_step` updates."""
    current = self.policy.trainable_part(params)
    trainable = jax.tree.unflatten(jax.tree.structure(current), leaves)
    if self.overlapped:
      self._copy_frozen(params)
      trainable = jax.device_put(trainable, sharding_lib.param_shardings(trainable, self.sampler_mesh))
      self.params = self.policy.joined(trainable, self._frozen)
    else:  # resumed inline (rollout.sampler_devices may change on a resume): laid out as the trainer's
      trainable = jax.device_put(trainable, jax.tree.map(lambda x: x.sharding, current))
      self.params = self.policy.joined(trainable, self.policy.frozen_part(params))
    self.params_step, self._then = step, (params, params_step)

  def _copy_frozen(self, params) -> None:
    if self._frozen is None and (frozen := self.policy.frozen_part(params)) is not None:
      self._frozen = self._to_sampler(frozen)

  def _to_sampler(self, tree):
    """`tree` cast for compute and laid out on the sampler's mesh by its own axes (`make_meshes`)."""
    tree = self.cast(tree)
    return jax.device_put(tree, sharding_lib.param_shardings(tree, self.sampler_mesh))

  def fill(self, state, step: int):
    """`state` with the batches of steps `step` .. `step` + k pending, those not yet sampled sampled now with
    the sampler's parameters (overlapped, the last one is left to `during_update`). With a decode budget
    (grpo_jax/train/partial.py), the batches of `step` .. `step` + k in flight advanced a segment each (overlapped,
    only the batch of `step`, finished: `during_update` advances the others), the first one complete."""
    if self.decode_budget:
      if self._then is not None:  # resumed behind: the segments the saved step's overlapped sampling had left
        state = self.advance(state, step, step + self.staleness - 1)
      self._sync_then()
      return self.advance(state, step, step if self.overlapped else step + self.staleness)
    state = self.ahead(state, step, step + self.staleness - self.overlapped)
    self._sync_then()
    return state

  def _sync_then(self) -> None:
    if self._then is not None:
      self.sync(*self._then)
      self._then = None

  def during_update(self, step: int) -> Callable | None:
    """Overlapped: state -> state with the batch of step + 1 + k pending, sampled while update `step` runs (with a
    decode budget: the batches of step + 1 .. step + k advanced a segment each, the last one started)."""
    if not self.overlapped:
      return None
    if self.decode_budget:
      return lambda state: self.advance(state, step + 1, step + self.staleness)
    return lambda state: self.ahead(state, step + 1, step + self.staleness)

  def advance(self, state, first: int, last: int):
    """`state` with the batches of steps `first` .. `last` pending, each one in flight advanced by a segment of the
    sampler's policy (the policy after q = `params_step` updates) and those not yet started started: at most
    `decode_budget` new tokens per row, none for the batch of step q + 1 (its last segment). A batch advanced by
    q was last advanced by q - 1 or starts with q = max(0, t - 1 - k), so every token of batch t is sampled by a
    policy within k updates of t - 1 (checked here)."""
    pending, position, q, k = list(state.pending), state.data_position, self.params_step, self.staleness
    for t in range(first, last + 1):
      i = t - first
      batch = pending[i] if i < len(pending) else None
      if i < len(pending) and not isinstance(batch, partial.InFlight):
        continue  # complete
      expected = batch.policy + 1 if batch is not None else max(0, t - 1 - k)
      if q != expected or not 0 <= t - 1 - q <= k:
        raise AssertionError(f"batch {t}: a segment by policy {q}, where its schedule has {expected} (staleness {k})")
      start = None
      if batch is None:
        columns = self.task.train_rows(position + self.offset, self.count)
        with self._on_sampler():
          key_data = partial.row_key_data(jax.random.fold_in(self.base_key, t),
                                          len(columns["prompt"]) * self.rollout_spec.group_size)
        start, position = (t, position, columns, key_data), position + self.settings.grpo.prompts_per_step
        pending.append(None)
      counted = self.slot_counts()
      with self._on_sampler():  # (the small programs of a complete batch's advantages too)
        batch, seconds = partial.segment(self.sampler, self.params, self.tokenizer, self.rollout_spec, batch, q,
                                         None if q == t - 1 else self.decode_budget, start)
        batch = batch._replace(slot_steps=tuple(a + b - c for a, b, c in zip(batch.slot_steps, self.slot_counts(),
                                                                               counted)))
        self._seconds["timing/sample_s"] += seconds
        if batch.done_B.all():
          batch = partial.completed(batch, self.tokenizer, self.rollout_spec)
          self._seconds["timing/reward_s"] += batch.seconds[1]
      pending[i] = batch
    return state._replace(pending=tuple(pending), data_position=position)

  def ahead(self, state, step: int, last: int):
    """`state` with the batches of steps `step` .. `last` pending, sampling those not yet sampled (by the
    sampler's policy: rollout/policy_step)."""
    pending, position = list(state.pending), state.data_position
    while step + len(pending) <= last:
      rollout, position = self.sample(self.params, position, step + len(pending))
      rollout.metrics["rollout/policy_step"] = self.params_step
      pending.append(rollout)
    return state._replace(pending=tuple(pending), data_position=position)

  def sample(self, params, data_position: int, step: int) -> tuple[Rollout, int]:
    """(the batch of `step` sampled by `params` from the rows at `data_position` on, the data position past the
    rows it used)."""
    g = self.settings.grpo
    position = data_position

    def next_columns():  # this process's prompts of the next prompts_per_step rows; advances the position
      nonlocal position
      columns = self.task.train_rows(position + self.offset, self.count)
      position += g.prompts_per_step
      return columns

    counted = self.slot_counts()
    with self._on_sampler():
      key = jax.random.fold_in(self.base_key, step)
      if g.dynamic_sampling:  # DAPO: more prompts until the batch has prompts_per_step groups with signal
        rollout = collect_dynamic_rollout(self.sampler, params, self.tokenizer, next_columns, self.rollout_spec,
                                          key, max_rounds=g.dynamic_sampling_max_rounds, all_done=self.all_true)
      else:
        rollout = collect_rollout(self.sampler, params, self.tokenizer, next_columns(), self.rollout_spec, key)
    slot_steps, kept = (now - then for now, then in zip(self.slot_counts(), counted))
    if slot_steps:  # decode slot-steps that produced a kept token
      rollout.metrics["sampling/slot_utilization"] = kept / slot_steps
    self._seconds["timing/sample_s"] += rollout.seconds[0]
    self._seconds["timing/reward_s"] += rollout.seconds[1]
    return rollout, position

  def _on_sampler(self) -> Any:
    """Overlapped: the sampler's first device as the default one (where uncommitted arrays are made)."""
    return contextlib.nullcontext() if self.sampler_mesh is None else jax.default_device(
        self.sampler_mesh.devices.flat[0])


def _slot_counts(sampler) -> Callable[[], tuple[int, int]]:
  """() -> (slot_steps, kept_slot_steps) of the Sampler inside `sampler`'s wrappers (distributed.GlobalSampler,
  episodes.EpisodeSampler), counters that give sampling/slot_utilization; (0, 0) for a sampler without them."""
  while sampler is not None and not hasattr(sampler, "slot_steps"):
    sampler = getattr(sampler, "sampler", None) or getattr(sampler, "turn_sampler", None)
  return lambda: (sampler.slot_steps, sampler.kept_slot_steps) if sampler is not None else (0, 0)
