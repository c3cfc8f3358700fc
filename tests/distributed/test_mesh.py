"""One GRPO update, sampling and checkpoints on 8 virtual CPU devices: meshes (data, fsdp, tensor) =
(8,1,1), (2,4,1), (2,2,2) against the same computation on one device (the worker: mesh_worker.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.virtual_devices import run_worker

MESHES = ["(8, 1, 1)", "(2, 4, 1)", "(2, 2, 2)"]
# Worker model: V=64, D=32, F=48, 4 heads, 2 kv heads, H=8; rollout batch of 16 rows.
# Per-device shard shapes worked out by hand from LOGICAL_RULES (embed->fsdp, heads/mlp/vocab->tensor).
SHARDS = {
    "(8, 1, 1)": {"embed_VxD": (64, 32), "k_DxKxH": (32, 2, 8), "o_NxHxD": (4, 8, 32), "down_FxD": (48, 32),
                  "lm_head_DxV": (32, 64), "batch_rows": 2},
    "(2, 4, 1)": {"embed_VxD": (64, 8), "k_DxKxH": (8, 2, 8), "o_NxHxD": (4, 8, 8), "down_FxD": (48, 8),
                  "lm_head_DxV": (8, 64), "batch_rows": 2},
    "(2, 2, 2)": {"embed_VxD": (32, 16), "k_DxKxH": (16, 1, 8), "o_NxHxD": (2, 8, 16), "down_FxD": (24, 16),
                  "lm_head_DxV": (16, 32), "batch_rows": 4},
}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  return run_worker(Path(__file__).with_name("mesh_worker.py"), str(tmp_path_factory.mktemp("mesh")))


def _shards(layout: dict, suffix: str) -> list:
  hits = [v for k, v in layout.items() if f"['{suffix}']" in k]
  assert hits, f"no leaf named {suffix} in {list(layout)[:5]}..."
  return hits


@pytest.mark.parametrize("mesh", MESHES)
def test_update_on_mesh_equals_single_device(result, mesh):
  one, sharded = result["(1, 1, 1)"], result[mesh]
  assert one["moved"] > 1e-3  # the update really changed the parameters
  for name in ("loss", "grad_norm", "kl", "policy_loss", "entropy", "clip_ratio/region"):
    assert sharded["metrics"][name] == pytest.approx(one["metrics"][name], rel=2e-5, abs=1e-7), name
  # 4 AdamW updates of size ~lr = 1e-2: differences of float32 summation order stay far below one update.
  assert sharded["params_diff"] < 5e-5
  assert sharded["opt_diff"] < 1e-7
  assert sharded["param_shardings_kept"]


@pytest.mark.parametrize("mesh", MESHES)
def test_params_optimizer_state_reference_and_batch_are_sharded(result, mesh):
  layout, want = result[mesh]["layout"], SHARDS[mesh]
  for name in ("embed_VxD", "k_DxKxH", "o_NxHxD", "down_FxD", "lm_head_DxV"):
    # parameters, both Adam moments, and the reference copy: one shard shape each, on all 8 devices.
    leaves = (_shards(layout["params"], name) + _shards(layout["opt_state"], name) +
              _shards(layout["ref_params"], name))
    assert len(leaves) == 4, name
    for leaf in leaves:
      assert leaf["shards"] == [list(want[name])], (name, leaf)
      assert leaf["devices"] == 8
  for name, leaf in layout["batch"].items():
    assert leaf["spec"] == [["data", "fsdp"]] and leaf["shards"][0][0] == want["batch_rows"], name
  # The reference parameters live in host memory on the mesh that turns offloading on.
  kinds = {leaf["memory_kind"] for leaf in layout["ref_params"].values()}
  assert kinds == ({"pinned_host"} if mesh == "(2, 2, 2)" else {"device"})


@pytest.mark.parametrize("mesh", MESHES)
def test_sampling_on_mesh_gives_the_same_tokens(result, mesh):
  assert result[mesh]["tokens_equal"]
  assert result[mesh]["sample_logp_diff"] < 1e-5
  # Each device decodes its own rows: 8 prompts over data * fsdp = 8 (1 row each) or 4 (2 rows each).
  assert result[mesh]["sampler_cache_rows"] == (2 if mesh == "(2, 2, 2)" else 1)
  assert result["(1, 1, 1)"]["sampler_cache_rows"] == 8


def test_grouped_prefill_and_decode_segments_on_the_mesh_of_all_three_axes(result):
  # On (2, 2, 2) only, the mesh that splits rows over data and fsdp and kv heads over tensor at once: their
  # programs on every mesh took 22 s of this file's 58 (2-core VM, 2026-11-28).
  three_axes = result["(2, 2, 2)"]
  assert three_axes["grouped_equal"]
  # sampling.decode_segment: the same tokens, the grown cache still split over the devices
  assert three_axes["segmented_equal"]
  assert three_axes["segmented_cache_rows"] == three_axes["sampler_cache_rows"] == 2


@pytest.mark.parametrize("target", ["(8, 1, 1)", "(1, 2, 4)", "(1, 1, 1)"])
def test_checkpoint_from_2x2x2_restores_onto_another_mesh(result, target):
  restored = result["restores"][target]
  assert restored["step"] == 1
  assert restored["max_diff"] == 0.0
  assert restored["shardings_match"]
  embed = _shards(restored["layout"], "embed_VxD")
  want = {"(8, 1, 1)": [64, 32], "(1, 2, 4)": [16, 16], "(1, 1, 1)": [64, 32]}[target]
  assert all(leaf["shards"] == [want] for leaf in embed)
  # saved with the reference in host memory, restored into device memory as the target asks
  saved_kinds = {v["memory_kind"] for k, v in result["saved_layout"].items() if k.startswith("['ref_params']")}
  assert saved_kinds == {"pinned_host"}
  assert {leaf["memory_kind"] for leaf in restored["layout"].values()} == {"device"}
