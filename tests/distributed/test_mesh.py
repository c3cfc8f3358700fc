"""One GRPO update, sampling and checkpoints on 8 virtual CPU devices: meshes (data, fsdp, tensor) =
(2,4,1), (2,2,2) against the same computation on one device (the worker: mesh_worker.py); a checkpoint saved on
(2,2,2) restores onto (8,1,1), (1,2,4) and one device. Data parallelism alone trains in
tests/train/test_data_parallel.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.tolerance import assert_close_f32
from tests.virtual_devices import run_worker

MESHES = ["(2, 4, 1)", "(2, 2, 2)"]
# Worker model: V=64, D=32, F=48, 4 heads, 2 kv heads, H=8; rollout batch of 16 rows.
# Per-device shard shapes worked out by hand from LOGICAL_RULES (embed->fsdp, heads/mlp/vocab->tensor).
SHARDS = {
    "(2, 4, 1)": {"embed_VxD": (64, 8), "k_DxKxH": (8, 2, 8), "o_NxHxD": (4, 8, 8), "down_FxD": (48, 8),
                  "lm_head_DxV": (8, 64), "batch_rows": 2},
    "(2, 2, 2)": {"embed_VxD": (32, 16), "k_DxKxH": (16, 1, 8), "o_NxHxD": (2, 8, 16), "down_FxD": (24, 16),
                  "lm_head_DxV": (16, 32), "batch_rows": 4},
}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("mesh")
  out = run_worker(Path(__file__).with_name("mesh_worker.py"), str(tmp))
  for mesh in ["(1, 1, 1)", *MESHES]:  # updated parameters and momentum (by key path), sampled log-probs
    with np.load(tmp / f"{mesh[1:-1].replace(', ', 'x')}.npz") as f:
      out[mesh]["arrays"] = {k: f[k] for k in f.files}
  return out


def _shards(layout: dict, suffix: str) -> list:
  hits = [v for k, v in layout.items() if f"['{suffix}']" in k]
  assert hits, f"no leaf named {suffix} in {list(layout)[:5]}..."
  return hits


def _close_logp(got, want, what: str):
  """Sampled tokens' log-probs from two programs: a logit minus a log-sum-exp, rounded at the size of the larger
  (log 64 = 4.2 or the log-prob itself; seen: at most 1 ulp of it)."""
  assert_close_f32(got, want, ulps=8, scale=np.maximum(np.log(64), np.abs(want)), err_msg=what)


@pytest.mark.parametrize("mesh", MESHES)
def test_update_on_mesh_equals_single_device(result, mesh):
  one, sharded = result["(1, 1, 1)"], result[mesh]
  assert one["moved"] > 1e-3  # the update really changed the parameters
  # The metrics: means over tokens and updates of terms up to a log-prob of this vocabulary (log 64 = 4.2), so
  # rounded at that size even where the mean is near 0 (seen: at most 1 ulp of it).
  for name in ("loss", "grad_norm", "kl", "policy_loss", "entropy", "clip_ratio/region"):
    want = one["metrics"][name]
    assert_close_f32(sharded["metrics"][name], want, ulps=8, scale=max(np.log(64), abs(want)), err_msg=name)
  # 4 updates of SGD with momentum (mesh_worker.py's OPTIMIZER): each gradient summed in another order on each
  # mesh, the parameters and the momentum (a sum of the 4 gradients) agree to ulps of each leaf's largest (seen:
  # 1.9 and 5.5, with and without XLA's optimizations).
  got, want = sharded["arrays"], one["arrays"]
  assert got.keys() >= want.keys()
  for k in [k for k in want if k.startswith(("params", "opt_state"))]:
    assert_close_f32(got[k], want[k], ulps=16 if k.startswith("params") else 48, err_msg=k)
  assert sharded["param_shardings_kept"]


@pytest.mark.parametrize("mesh", MESHES)
def test_params_optimizer_state_reference_and_batch_are_sharded(result, mesh):
  layout, want = result[mesh]["layout"], SHARDS[mesh]
  for name in ("embed_VxD", "k_DxKxH", "o_NxHxD", "down_FxD", "lm_head_DxV"):
    # parameters, their momentum, and the reference copy: one shard shape each, on all 8 devices.
    leaves = (_shards(layout["params"], name) + _shards(layout["opt_state"], name) +
              _shards(layout["ref_params"], name))
    assert len(leaves) == 3, name
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
  _close_logp(result[mesh]["arrays"]["sample_logp"], result["(1, 1, 1)"]["arrays"]["sample_logp"], "sampled")
  # Each device decodes its own rows: 8 prompts over data * fsdp = 8 (1 row each) or 4 (2 rows each).
  assert result[mesh]["sampler_cache_rows"] == (2 if mesh == "(2, 2, 2)" else 1)
  assert result["(1, 1, 1)"]["sampler_cache_rows"] == 8


def test_grouped_prefill_and_decode_segments_on_the_mesh_of_all_three_axes(result):
  # On (2, 2, 2) only, the mesh that splits rows over data and fsdp and kv heads over tensor at once: their
  # programs on every mesh took 22 s of this file's 58 (2-core VM, 2026-11-28).
  three_axes = result["(2, 2, 2)"]
  assert three_axes["grouped_equal"]
  _close_logp(three_axes["arrays"]["grouped_logp"], three_axes["arrays"]["repeated_logp"], "grouped")
  # sampling.decode_segment: the same tokens, the grown cache still split over the devices
  assert three_axes["segmented_equal"]
  _close_logp(three_axes["arrays"]["segmented_logp"], three_axes["arrays"]["sample_logp"], "in segments")
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
