"""Checkpointer: keeps the last K, ignores unfinished saves, falls back past unreadable or altered ones, saves
asynchronously without racing the arrays it saves; the state fingerprint against a numpy reference."""
from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.persist import checkpoint, fingerprint, layout
from grpo_jax.persist.checkpoint import Checkpointer, restore_params, save_initial_state
from grpo_jax.persist.fingerprint import state_fingerprint
from tests.virtual_devices import run_worker


def _state(x):
  return {"params": {"w": jnp.full((3, 2), x, jnp.float32)}, "count": jnp.int32(x)}


def _abstract():
  return jax.eval_shape(lambda: _state(0.0))


def test_keeps_last_k_and_restores_the_newest(tmp_path):
  ck = Checkpointer(str(tmp_path / "ck"), keep=2)
  for step in range(3):
    ck.save(step, _state(float(step)), {"data_position": step * 10})
  assert ck.all_steps() == [1, 2]
  restored = ck.restore_latest(_abstract())
  assert restored.step == 2 and restored.meta["data_position"] == 20
  np.testing.assert_array_equal(restored.state["params"]["w"], np.full((3, 2), 2.0))
  ck.close()


def test_unfinished_save_is_ignored(tmp_path):
  ck = Checkpointer(str(tmp_path / "ck"), keep=3)
  ck.save(1, _state(1.0), {})
  ck.close()
  # A save interrupted mid-way leaves only orbax's temporary directory behind.
  os.makedirs(tmp_path / "ck" / "2.orbax-checkpoint-tmp" / "state")
  assert layout.committed_steps(str(tmp_path / "ck")) == [1]  # read without a writer's manager
  assert layout.committed_steps(str(tmp_path / "absent")) == []
  ck = Checkpointer(str(tmp_path / "ck"), keep=3)
  assert ck.all_steps() == [1]
  assert ck.restore_latest(_abstract()).step == 1
  ck.close()


def test_a_starting_point_is_a_committed_step_0(tmp_path):
  os.makedirs(tmp_path / "run" / "warmstart" / "0.orbax-checkpoint-tmp" / "state")  # a warm start cut short
  assert layout.RunFiles(str(tmp_path / "run")).starting_point() is None
  save_initial_state(str(tmp_path / "run" / "checkpoints"), {"w": jnp.ones((2,))}, {})
  assert layout.RunFiles(str(tmp_path / "run")).starting_point() == str(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize("damage", ["meta_json", "altered_bytes"])
def test_damaged_latest_falls_back_with_a_warning(tmp_path, damage):
  directory = str(tmp_path / "ck")
  ck = Checkpointer(directory, keep=3)
  ck.save(1, _state(1.0), {})
  ck.save(2, _state(2.0), {})
  ck.close()
  if damage == "meta_json":
    with open(os.path.join(directory, "2", "meta", "metadata"), "w") as f:
      f.write('{"step": 2, "trunc')
  else:  # readable, but not what was saved: caught by the stored fingerprint
    with open(os.path.join(directory, "2", "meta", "metadata")) as f:
      meta = json.load(f)
    meta["state_fingerprint"] = state_fingerprint(_state(3.0))
    with open(os.path.join(directory, "2", "meta", "metadata"), "w") as f:
      json.dump(meta, f)
  ck = Checkpointer(directory, keep=3)
  with pytest.warns(RuntimeWarning, match="step 2 .* falling back"):
    restored = ck.restore_latest(_abstract())
  assert restored.step == 1
  assert os.path.isdir(directory + "_damaged/2") and ck.all_steps() == [1]
  ck.save(2, _state(2.0), {})  # the step can be written again
  assert ck.restore_latest(_abstract()).step == 2
  ck.close()


def test_params_of_another_runs_checkpoint_are_read_without_touching_it(tmp_path):
  ck = Checkpointer(str(tmp_path / "donor"), keep=2)
  ck.save(0, _state(5.0), {"data_position": 7})
  ck.close()
  os.makedirs(tmp_path / "donor" / "1.orbax-checkpoint-tmp")  # the donor is saving right now: leave that alone
  abstract = _abstract()["params"]
  params, meta = restore_params(str(tmp_path / "donor"), 0, abstract)  # params only; "count" is left out
  np.testing.assert_array_equal(params["w"], np.full((3, 2), 5.0))
  assert meta["data_position"] == 7
  assert os.path.isdir(tmp_path / "donor" / "1.orbax-checkpoint-tmp")
  with pytest.raises(FileNotFoundError, match="no complete checkpoint at step 3"):
    restore_params(str(tmp_path / "donor"), 3, abstract)
  # A parameters-only save (a run's warmstart/ directory) is checked against its checksum.
  save_initial_state(str(tmp_path / "ws"), _state(2.0)["params"], {"data_position": 3})
  params, meta = restore_params(str(tmp_path / "ws"), 0, abstract)
  np.testing.assert_array_equal(params["w"], np.full((3, 2), 2.0))
  assert meta["params_only"] and meta["data_position"] == 3
  meta_file = tmp_path / "ws" / "0" / "meta" / "metadata"
  meta_json = json.loads(meta_file.read_text())
  meta_json["state_fingerprint"] = "0" * 64
  meta_file.write_text(json.dumps(meta_json))
  with pytest.raises(ValueError, match=r"ws \(step 0\): the state's fingerprint does not match"):
    restore_params(str(tmp_path / "ws"), 0, abstract)


def _leaf_fingerprint(x) -> np.ndarray:
  """uint32[2]: the two wrap-around sums of one array (grpo_jax/persist/fingerprint.py), computed where it lives."""
  return fingerprint._combine(jax.device_get(fingerprint._shard_parts(x)))


def _numpy_fingerprint(x: np.ndarray) -> tuple[int, int]:
  """The two wrap-around sums of `_leaf_fingerprint`, in Python integers."""
  itemsize = x.dtype.itemsize
  u = x.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[itemsize]).astype(np.uint64)
  odd = 2 * np.arange(u.size, dtype=np.uint64) + 1
  mod = 1 << 32
  s1 = int(sum(int(a) * int(w) for a, w in zip(u, odd)) % mod)
  s2 = int(sum(int(a) * (int(w) * 0x9E3779B1 % mod) for a, w in zip(u, odd)) % mod)
  return s1, s2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "uint8"])
def test_leaf_fingerprint_matches_numpy_and_sees_one_changed_element(dtype):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(5, 7)) * 100).astype(dtype)
  got = tuple(int(v) for v in np.asarray(_leaf_fingerprint(x)))
  assert got == _numpy_fingerprint(np.asarray(x))
  for i, j in [(0, 0), (4, 6), (2, 3)]:  # any single changed element changes both sums (odd weights)
    y = x.at[i, j].set(x[i, j] + 1)
    other = np.asarray(_leaf_fingerprint(y))
    assert np.all(other != np.asarray(got))
  swapped = x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0])  # the same values in another order
  if x[0, 0] != x[0, 1]:
    assert tuple(int(v) for v in np.asarray(_leaf_fingerprint(swapped))) != got


def test_shard_parts_add_up_to_the_whole_arrays_fingerprint():
  """The fingerprint is computed shard by shard on each shard's device (no collective): the parts of the
  blocks of a (6, 8) array cut 2 x 4 ways, each with its first word and the whole array's strides, sum to
  the whole array's sums; a PRNG key array (2 words per key) and a scalar match numpy too."""
  x = jnp.asarray(np.random.default_rng(1).normal(size=(6, 8)), jnp.float32)
  strides = (8, 1, 1)  # words of the array read as (6, 8, 1)
  parts = [fingerprint._jitted_shard_sums(x[r:r + 3, c:c + 2], np.uint32(r * 8 + c), strides)
           for r in (0, 3) for c in (0, 2, 4, 6)]
  assert tuple(int(v) for v in fingerprint._combine(jax.device_get(parts))) == _numpy_fingerprint(np.asarray(x))
  keys = jax.random.split(jax.random.key(3), 5)
  assert tuple(int(v) for v in _leaf_fingerprint(keys)) == _numpy_fingerprint(
      np.asarray(jax.random.key_data(keys)))
  assert tuple(int(v) for v in _leaf_fingerprint(jnp.int32(7))) == _numpy_fingerprint(
      np.asarray([7], np.int32))


def test_fingerprint_compiles_one_program_per_shape_whatever_the_sharding():
  """The digest of an array on a one-device mesh (NamedSharding) and of the same values on the default device
  (SingleDeviceSharding) are equal and share one compiled program."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  x = jnp.asarray(np.random.default_rng(5).normal(size=(5, 7)), jnp.float32)
  on_mesh = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  before = fingerprint._jitted_shard_sums._cache_size()
  assert state_fingerprint({"w": on_mesh}) == state_fingerprint({"w": x})
  assert fingerprint._jitted_shard_sums._cache_size() - before <= 1  # 2 when each sharding compiles its own


def test_fingerprint_sees_values_layout_and_dtype():
  a = state_fingerprint(_state(1.0))
  assert a == state_fingerprint(_state(1.0))
  assert a != state_fingerprint(_state(2.0))
  assert a != state_fingerprint({"params": {"v": jnp.full((3, 2), 1.0)}, "count": jnp.int32(1)})
  assert a != state_fingerprint({"params": {"w": jnp.full((2, 3), 1.0)}, "count": jnp.int32(1)})
  assert a != state_fingerprint({"params": {"w": jnp.full((3, 2), 1, jnp.int32)}, "count": jnp.int32(1)})


def test_async_save_returns_before_the_files_and_keeps_what_it_was_given(tmp_path):
  """The arrays given to an asynchronous save are overwritten (donated to a jitted update) right after it
  returns; the checkpoint holds the values at the call, and restores with its fingerprint checked."""
  ck = Checkpointer(str(tmp_path / "ck"), keep=2, async_save=True)
  big = {"w": jnp.arange(2_000_000, dtype=jnp.float32), "count": jnp.int32(3)}
  expected = np.asarray(big["w"]).copy()
  ck.save(1, big, {"data_position": 1})
  bump = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
  after = bump(big)  # may reuse the saved arrays' buffers
  jax.block_until_ready(after)
  restored = ck.restore_latest(jax.eval_shape(lambda: big))  # waits for the save first
  assert restored.step == 1 and restored.meta["state_fingerprint"] == state_fingerprint(restored.state)
  np.testing.assert_array_equal(restored.state["w"], expected)
  assert int(restored.state["count"]) == 3
  ck.close()


def test_fingerprint_of_arrays_in_host_memory_equals_their_device_copies():
  """An offloaded reference model lives in pinned_host memory; its fingerprint is that of the same values."""
  x = jnp.arange(24, dtype=jnp.float32).reshape(4, 6)
  kinds = [m.kind for m in jax.devices()[0].addressable_memories()]
  if "pinned_host" not in kinds:
    pytest.skip(f"this backend has no pinned_host memory ({kinds})")
  host = jax.device_put(x, x.sharding.with_memory_kind("pinned_host"))
  assert host.sharding.memory_kind == "pinned_host"
  assert state_fingerprint({"ref": host}) == state_fingerprint({"ref": x})


def test_restore_params_refuses_what_the_checkpoint_does_not_hold(tmp_path):
  """orbax's partial restore hands back the abstract target for arrays a checkpoint lacks; restore_params names
  them instead (and says when the checkpoint is a LoRA run's, which holds the adapters alone)."""
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  want = {"w": jax.ShapeDtypeStruct((3,), jnp.float32, sharding=one)}
  for name, state in [("full", {"params": {"v": np.ones(3, np.float32)}}),
                      ("lora", {"adapters": {"w": np.ones(3, np.float32)}, "opt_state": {"m": np.zeros(2)}})]:
    ck = Checkpointer(str(tmp_path / name), keep=1)
    ck.save(0, state, {})
    ck.close()
    with pytest.raises(ValueError, match=r"holds no params\['w'\]") as err:
      checkpoint.restore_params(str(tmp_path / name), 0, want)
    assert ("LoRA run's checkpoint" in str(err.value)) == (name == "lora")
  adapters, _ = checkpoint.restore_params(str(tmp_path / "lora"), 0, want, item="adapters")
  np.testing.assert_array_equal(adapters["w"], np.ones(3))


def test_a_failed_background_save_is_reported_by_check(tmp_path):
  """The write fails for real (the worker caps file sizes below the checkpoint's): `check` raises one
  CheckpointSaveError that names the cause and the fix, soon after, and the first checkpoint stays readable."""
  out = run_worker(Path(__file__).with_name("save_error_worker.py"), str(tmp_path / "ck"), devices=1, timeout=300)
  assert out["error"] is not None, "check() never reported the failed save"
  assert "File too large" in out["error"] and "free disk space" in out["error"], out["error"]
  assert out["seconds"] < 30
  restored = Checkpointer(str(tmp_path / "ck"), keep=2).restore_latest(
      jax.eval_shape(lambda: {"w": jnp.zeros((512, 512), jnp.float32)}))
  assert restored.step == 1


def test_the_loop_stops_at_the_step_a_save_failed(tmp_path, monkeypatch):
  """Wiring: the step loop asks the checkpointer every step, so a save that failed in the background (here the
  one at step 2) stops the run at step 3 with its history on disk, not at the next checkpoint."""
  from grpo_jax.errors import CheckpointSaveError
  from grpo_jax.train import loop
  from grpo_jax.persist.metrics import read_jsonl
  from tests.train.conftest import load_experiment

  config = load_experiment("default")("test")
  config.num_steps, config.checkpoint.every, config.warmstart.max_steps = 8, 2, 1
  calls = []

  def check(self):
    calls.append(1)
    if len(calls) >= 3:
      raise CheckpointSaveError("writing a checkpoint failed (No space left on device)")

  monkeypatch.setattr(Checkpointer, "check", check)
  with pytest.raises(CheckpointSaveError, match="No space left on device"):
    loop.train(config, str(tmp_path / "run"))
  assert [r["step"] for r in read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))] == [0, 1, 2]


@pytest.mark.parametrize("error, user_error", [(OSError(28, "No space left on device"), True),
                                               (ValueError("a bug in the saved pytree"), False)])
def test_only_a_refused_write_becomes_a_user_error(tmp_path, monkeypatch, error, user_error):
  """A write the OS refused is the user's to fix (one line, exit 2); any other failure is a bug and raises as is."""
  from grpo_jax.errors import CheckpointSaveError
  ck = Checkpointer(str(tmp_path / "ck"), keep=2)

  def fail():
    raise error

  monkeypatch.setattr(ck._manager, "wait_until_finished", fail)
  with pytest.raises(CheckpointSaveError if user_error else ValueError) as caught:
    ck.wait()
  assert isinstance(caught.value, CheckpointSaveError) == user_error
  assert ("No space left on device" in str(caught.value)) == user_error
  monkeypatch.undo()
  ck.close()
