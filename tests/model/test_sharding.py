"""Sharding rules: logical axes -> mesh axes; parameters really sharded on 8 virtual CPU devices."""
from __future__ import annotations

from pathlib import Path

import jax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from grpo_jax.model import sharding
from tests.virtual_devices import run_worker

# Parameter -> (PartitionSpec entries, per-device shard shape) on a mesh data=2, fsdp=2, tensor=2, for the
# worker's model: V=64, D=32, F=48, N=4 heads, K=2 kv heads, H=8.
EXPECTED_2x2x2 = {
    "embed_VxD": (["tensor", "fsdp"], (32, 16)),
    "lm_head_DxV": (["fsdp", "tensor"], (16, 32)),
    "final_norm.scale": ([None], (32,)),
    "layers.0.input_norm.scale": ([None], (32,)),
    "layers.0.post_attn_norm.scale": ([None], (32,)),
    "layers.0.attn.q_DxNxH": (["fsdp", "tensor", None], (16, 2, 8)),
    "layers.0.attn.k_DxKxH": (["fsdp", "tensor", None], (16, 1, 8)),
    "layers.0.attn.v_DxKxH": (["fsdp", "tensor", None], (16, 1, 8)),
    "layers.0.attn.o_NxHxD": (["tensor", None, "fsdp"], (2, 8, 16)),
    "layers.0.attn.q_norm.scale": ([None], (8,)),
    "layers.0.attn.k_norm.scale": ([None], (8,)),
    "layers.0.mlp.gate_DxF": (["fsdp", "tensor"], (16, 24)),
    "layers.0.mlp.up_DxF": (["fsdp", "tensor"], (16, 24)),
    "layers.0.mlp.down_FxD": (["tensor", "fsdp"], (24, 16)),
}
# data=1, fsdp=2, tensor=4: 2 kv heads do not divide 4, so that dimension is replicated.
CHANGED_1x2x4 = {
    "embed_VxD": (["tensor", "fsdp"], (16, 16)),
    "lm_head_DxV": (["fsdp", "tensor"], (16, 16)),
    "layers.0.attn.q_DxNxH": (["fsdp", "tensor", None], (16, 1, 8)),
    "layers.0.attn.k_DxKxH": (["fsdp", None, None], (16, 2, 8)),
    "layers.0.attn.v_DxKxH": (["fsdp", None, None], (16, 2, 8)),
    "layers.0.attn.o_NxHxD": (["tensor", None, "fsdp"], (1, 8, 16)),
    "layers.0.mlp.gate_DxF": (["fsdp", "tensor"], (16, 12)),
    "layers.0.mlp.up_DxF": (["fsdp", "tensor"], (16, 12)),
    "layers.0.mlp.down_FxD": (["tensor", "fsdp"], (12, 16)),
}
FULL_SHAPES = {"embed_VxD": (64, 32), "lm_head_DxV": (32, 64), "layers.0.attn.q_DxNxH": (32, 4, 8),
               "layers.0.mlp.down_FxD": (48, 32)}


@pytest.fixture(scope="module")
def worker_result(tmp_path_factory):
  return run_worker(Path(__file__).with_name("sharded_worker.py"), str(tmp_path_factory.mktemp("sharded_ckpt")),
                    timeout=300)


@pytest.mark.parametrize("how", ["shard_state", "from_pretrained"])
def test_parameters_are_sharded_as_configured(worker_result, how):
  got = worker_result[f"(2, 2, 2)/{how}"]["params"]
  assert set(got) == set(EXPECTED_2x2x2)
  for name, (spec, shard_shape) in EXPECTED_2x2x2.items():
    assert got[name]["spec"] == spec, name
    assert got[name]["shard_shapes"] == [list(shard_shape)], name
    assert got[name]["devices"] == 8
  got = worker_result[f"(1, 2, 4)/{how}"]["params"]
  for name, (spec, shard_shape) in {**EXPECTED_2x2x2, **CHANGED_1x2x4}.items():
    assert got[name]["spec"] == spec, name
    assert got[name]["shard_shapes"] == [list(shard_shape)], name
  # Pure data parallelism: every device holds whole parameters.
  got = worker_result[f"(8, 1, 1)/{how}"]["params"]
  for name, shape in FULL_SHAPES.items():
    assert got[name]["shard_shapes"] == [list(shape)], name


def test_sharded_forward_matches_single_device(worker_result):
  for key, result in worker_result.items():
    if key != "resave_equal":
      assert result["logits_diff"] < 1e-5, key


def test_save_pretrained_of_a_sharded_model_gives_the_same_tensors(worker_result):
  assert worker_result["resave_equal"] is True


def test_logical_to_spec_rules():
  mesh = AbstractMesh((2, 2, 4), sharding.MESH_AXES)
  assert sharding.logical_to_spec(("batch", "length"), mesh) == P(("data", "fsdp"), None)
  assert sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), mesh, shape=(32, 8, 4)) == P(
      "fsdp", "tensor", None)
  assert sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), mesh, shape=(32, 2, 4)) == P(
      "fsdp", None, None)  # 2 kv heads on a tensor axis of 4: replicated
  # A mesh axis is used at most once per array.
  rules = (("vocab", "tensor"), ("embed", "tensor"))
  assert sharding.logical_to_spec(("vocab", "embed"), mesh, rules, shape=(8, 8)) == P("tensor", None)
  with pytest.raises(ValueError, match="'experts' has no sharding rule"):
    sharding.logical_to_spec(("experts",), mesh)


def test_make_mesh_checks_the_device_count():
  n = jax.device_count()
  mesh = sharding.make_mesh()
  assert dict(mesh.shape) == {"data": n, "fsdp": 1, "tensor": 1}
  with pytest.raises(ValueError, match="data\\*fsdp\\*tensor"):
    sharding.make_mesh(data=n + 1)
  with pytest.raises(ValueError, match="not divisible by fsdp\\*tensor"):
    sharding.make_mesh(fsdp=n + 1)
