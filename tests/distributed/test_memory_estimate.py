"""The memory estimate (grpo_jax/commands/memory_estimate.py) against a hand-worked example and the published Qwen2.5 parameter counts."""
from __future__ import annotations

import os

import pytest

from benchmarks import memory_fit as mf
from grpo_jax.commands import memory_estimate as me
from grpo_jax.model import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# V=64, D=32, F=48, 2 layers, 4 heads, 2 kv heads, H=8; fp32 parameters, bf16 compute.
CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, param_dtype="float32", dtype="bfloat16")
WORK = me.Workload(sampler_batch=8, prompt_len=4, new_tokens=4, micro_batch=8, logprob_chunk=4)


def test_hand_worked_example_on_a_2x2x2_mesh():
  est = me.estimate(CFG, me.Mesh(2, 2, 2), WORK)
  # Parameters: embed 64*32 + lm_head 32*64 + final norm 32 + 2 layers x (q 32*4*8 + k 32*2*8 + v 32*2*8 +
  # o 4*8*32 + 3 MLP 32*48 + 2 norms 32) = 2048 + 2048 + 32 + 2 * 7744 = 19616.
  assert est["num_params"] == 19616
  # Per device: embed/lm_head split over tensor x fsdp (512 each), q/o over fsdp x tensor (256), k/v (128),
  # MLP matrices (384 each); norms replicated: 512 + 512 + 32 + 2 * (256 + 128 + 128 + 256 + 3*384 + 64) = 5024.
  assert est["params"] == est["grads"] == est["ref_params"] == 5024 * 4
  assert est["optimizer"] == 2 * 5024 * 4
  # KV cache: 2 layers x (k, v) x 8/4 rows x T=8 x 2/2 kv heads x H=8 x 2 bytes.
  assert est["kv_cache"] == 2 * 2 * 2 * 8 * 1 * 8 * 2 == 1024
  # Activations: 8/4 = 2 rows of T = 8; per token and layer (4*32 + 2*(2+2*1)*8 + 2*8 + 3*24) * 2 bytes +
  # 2 heads * 8 scores * (4 + 2) bytes = 656; log-prob chunk 2 * 2 rows * 4 * 32 vocab * 4 bytes = 2048.
  one_layer = 2 * 8 * 656
  assert est["activations"] == 2 * one_layer + 2048
  assert est["activations_remat"] == 2 * 2 * 8 * 32 * 2 + one_layer + 2048
  assert est["total"] == 5024 * 4 * 5 + 1024 + 2 * one_layer + 2048


def test_offloaded_or_absent_reference_and_replicated_kv_heads():
  base = me.estimate(CFG, me.Mesh(1, 1, 1), WORK)
  assert base["params"] == 19616 * 4
  assert me.estimate(CFG, me.Mesh(1, 1, 1), WORK._replace(offload_ref=True))["ref_params"] == 0
  assert me.estimate(CFG, me.Mesh(1, 1, 1), WORK._replace(use_ref=False))["ref_params"] == 0
  # tensor=4 does not divide the 2 kv heads: k/v weights and the KV cache keep both heads on every device.
  est = me.estimate(CFG, me.Mesh(1, 1, 4), WORK)
  assert est["kv_cache"] == 2 * 2 * 8 * 8 * 2 * 8 * 2
  kv_weights = 2 * 2 * (32 * 2 * 8)  # 2 layers x (k, v), not split
  rest = 2 * 64 * 32 // 4 + 32 + 2 * (2 * 32 * 4 * 8 // 4 + 3 * 32 * 48 // 4 + 64)
  assert est["params"] == (kv_weights + rest) * 4


@pytest.mark.parametrize("name, count", [("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304),
                                         ("qwen2.5-3b", 3_085_938_688), ("qwen2.5-7b", 7_615_616_512)])
def test_presets_have_the_published_parameter_counts(name, count):
  cfg = me.model_config(name, "bfloat16", "bfloat16")
  total, per_device = me.param_elements(cfg, me.Mesh(1, 8, 1))
  assert total == count
  assert count / 8 <= per_device < count / 8 * 1.01  # all but the norms (and biases) split 8 ways


def test_lora_trains_only_adapters_and_drops_the_reference():
  est = me.estimate(CFG, me.Mesh(1, 1, 1), WORK._replace(lora_rank=2, lora_targets="q_proj,down_proj"))
  # Rank 2 on q (32 -> 4*8) and down (48 -> 32), 2 layers: 2 * 2 * ((32 + 32) + (48 + 32)) = 576 adapters.
  assert est["trainable"] == 576
  assert est["params"] == (19616 + 576) * 4
  assert est["grads"] == 576 * 4 and est["optimizer"] == 2 * 576 * 4 and est["ref_params"] == 0
  full = me.estimate(CFG, me.Mesh(1, 1, 1), WORK)
  # Per token and layer the two projections keep x A (2 each) and their update (32 + 32), in bf16.
  assert est["activations"] - full["activations"] == 2 * 8 * 8 * (2 + 32 + 2 + 32) * 2
  # peft's count for Qwen2.5-7B with r = 16 on all seven linear projections.
  qwen = me.estimate(me.model_config("qwen2.5-7b", "bfloat16", "bfloat16"), me.Mesh(1, 1, 1),
                     me.Workload(lora_rank=16))
  assert qwen["trainable"] == 40_370_176


def test_cli_prints_every_category(capsys, tmp_path):
  import json
  from grpo_jax.model.config import to_hf_config
  (tmp_path / "config.json").write_text(json.dumps(to_hf_config(CFG)))
  me.main(["--hf-config", str(tmp_path), "--mesh", "2,2,2", "--param-dtype", "float32"])
  out = capsys.readouterr().out
  for k in me.COLUMNS:
    assert k in out
  with pytest.raises(SystemExit):
    me.main(["--model", "qwen2.5-7b", "--mesh", "2,x"])


def test_memory_fit_counts_the_update_state_and_runs_the_recipe_as_written():
  """benchmarks/memory_fit.py on the Countdown recipe's :test preset: XLA's arguments are exactly the parameters,
  AdamW state and batch, the donated parameters and AdamW state are updated in place, and a step runs."""
  import jax

  from grpo_jax import testing
  config = mf.recipe_config(os.path.join(ROOT, "experiments", "countdown.py:test"))
  cfg = mf.model_config(testing.ensure_fixtures()["checkpoint"], config)
  assert cfg.remat and cfg.dtype == "bfloat16" and config.model.offload_ref_params  # the recipe's structure
  step, params, opt_state, graphdef, optimizer = mf.build_update(cfg, config)
  xla = mf.compiled_update_bytes(step, params, opt_state, config)
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  assert xla["arguments"] == nbytes((params, opt_state, mf.abstract_batch(config)))
  assert xla["aliased"] == nbytes((params, opt_state))
  assert mf.the_estimate(cfg, config)["params"] == nbytes(params)
  rows = mf.run_steps(cfg, config, 1, step, graphdef, optimizer, log=lambda *_: None)
  assert [r["phase"].split(":")[0] for r in rows] == ["weights, AdamW, reference"] + ["step 1"] * 3


def test_memory_fit_with_lora_holds_adapter_state_only_and_runs_a_step():
  """--lora-rank: the update's arguments are the parameters (base and adapters), the adapters' AdamW state and
  the batch; the estimate counts the same parameters; a step runs with the base as the reference."""
  import jax

  from grpo_jax import testing
  from grpo_jax.model import lora
  config = mf.with_lora(mf.recipe_config(os.path.join(ROOT, "experiments", "countdown.py:test")), 4)
  cfg = mf.model_config(testing.ensure_fixtures()["checkpoint"], config)
  step, params, opt_state, graphdef, optimizer = mf.build_update(cfg, config)
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  adapters = lora.split_adapters(params)[0]
  assert nbytes(opt_state) < nbytes(adapters) * 2 + 64  # two moments of the adapters (and a step count)
  xla = mf.compiled_update_bytes(step, params, opt_state, config)
  assert xla["arguments"] == nbytes((params, opt_state, mf.abstract_batch(config)))
  assert mf.the_estimate(cfg, config)["params"] == nbytes(params)
  rows = mf.run_steps(cfg, config, 1, step, graphdef, optimizer, log=lambda *_: None)
  assert [r["phase"].split(":")[0] for r in rows] == ["weights, AdamW, reference"] + ["step 1"] * 3


def test_shared_prompt_forward_counts_prompts_once_and_the_copied_keys():
  """prompt_repeats=4 on one device: 8 rows run 8/4 = 2 prompts of 4 tokens and 8 completions of 4 tokens
  (8 + 32 = 40 token positions instead of 8 x 8 = 64), plus per layer each row's keys/values over 8 slots (2 kv heads x H 8)."""
  base = me.estimate(CFG, me.Mesh(1, 1, 1), WORK)
  shared = me.estimate(CFG, me.Mesh(1, 1, 1), WORK._replace(prompt_repeats=4))
  per_token_layer = (4 * 32 + 2 * (4 + 2 * 2) * 8 + 4 * 8 + 3 * 48) * 2 + 4 * 8 * (4 + 2)
  logits = 2 * 8 * 4 * 64 * 4
  kv = 8 * 8 * 2 * 2 * 8 * 2
  assert base["activations"] == 2 * 64 * per_token_layer + logits
  assert shared["activations"] == 2 * (40 * per_token_layer + kv) + logits
  assert shared["activations_remat"] == 2 * (40 * 32 * 2 + kv) + 40 * per_token_layer + kv + logits
  assert shared["params"] == base["params"] and shared["kv_cache"] == base["kv_cache"]
