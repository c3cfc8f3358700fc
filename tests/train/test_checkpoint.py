"""Checkpointer: keeps the last K, ignores unfinished saves, falls back past unreadable or altered ones."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.train.checkpoint import Checkpointer, state_checksum


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
  ck = Checkpointer(str(tmp_path / "ck"), keep=3)
  assert ck.all_steps() == [1]
  assert ck.restore_latest(_abstract()).step == 1
  ck.close()


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
  else:  # readable, but not what was saved: caught by the stored checksum
    with open(os.path.join(directory, "2", "meta", "metadata")) as f:
      meta = json.load(f)
    meta["state_sha256"] = state_checksum(_state(3.0))
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


def test_checksum_sees_values_and_layout():
  a = state_checksum(_state(1.0))
  assert a == state_checksum(_state(1.0))
  assert a != state_checksum(_state(2.0))
  assert a != state_checksum({"params": {"v": jnp.full((3, 2), 1.0)}, "count": jnp.int32(1)})
