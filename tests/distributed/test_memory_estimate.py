"""The memory estimate (grpo_jax/commands/memory_estimate.py) against hand-worked examples (a dense model, a mixture
of experts), the published parameter counts of Qwen2.5, Qwen3-30B-A3B and gpt-oss, and its fit plan."""
from __future__ import annotations

import math
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


def test_memory_fit_with_lora_holds_adapter_state_only():
  """--lora-rank: the update's arguments are the parameters (base and adapters), the adapters' AdamW state and
  the batch; the estimate counts the same parameters. (LoRA steps with the base as the reference run in
  tests/train/test_lora_training.py.)"""
  import jax

  from grpo_jax import testing
  from grpo_jax.model import lora
  config = mf.with_lora(mf.recipe_config(os.path.join(ROOT, "experiments", "countdown.py:test")), 4)
  cfg = mf.model_config(testing.ensure_fixtures()["checkpoint"], config)
  step, params, opt_state, _, _ = mf.build_update(cfg, config)
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  adapters = lora.split_adapters(params)[0]
  assert nbytes(opt_state) < nbytes(adapters) * 2 + 64  # two moments of the adapters (and a step count)
  xla = mf.compiled_update_bytes(step, params, opt_state, config)
  assert xla["arguments"] == nbytes((params, opt_state, mf.abstract_batch(config)))
  assert mf.the_estimate(cfg, config)["params"] == nbytes(params)


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


# A mixture of experts: layer 0 routes each token to k=2 of E=4 experts of F_moe=16 units, layer 1 is the dense MLP
# (F=48); q/k norms (Qwen3-MoE).
MOE = CFG.replace(family="qwen3_moe", qk_norm=True, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                  moe_layers=(True, False), norm_topk_prob=True)
MOE_EXPERTS = 3 * 4 * 32 * 16  # gate, up (E x D x F_moe) and down (E x F_moe x D) of layer 0


def test_moe_parameters_by_hand_and_split_by_the_expert_axis():
  # embed + lm_head + final norm 4128; layer 0: attention 3072 + q/k norms 16 + 2 norms 64 + router 32*4 + experts
  # 6144 = 9424; layer 1: 3072 + 16 + 64 + MLP 3*32*48 = 7760.
  total, local = me.param_elements(MOE, me.Mesh(1, 1, 1))
  assert total == local == 4128 + 9424 + 7760 == 21312
  assert me.active_params(MOE) == total - MOE_EXPERTS // 2  # k / E = 2 / 4 of the experts
  for e in (2, 4):
    assert me.param_elements(MOE, me.Mesh(1, 1, 1, e)) == (total, total - MOE_EXPERTS + MOE_EXPERTS // e)
  # fsdp 2 splits the experts' D as well (and the rest's embed axis): experts / 4 with expert 2.
  _, fsdp = me.param_elements(MOE, me.Mesh(1, 2, 1))
  assert me.param_elements(MOE, me.Mesh(1, 2, 1, 2))[1] == fsdp - MOE_EXPERTS // 2 + MOE_EXPERTS // 4
  assert me.estimate(MOE, me.Mesh(1, 1, 1, 4), WORK)["params"] == (total - MOE_EXPERTS * 3 // 4) * 4


def test_moe_activations_and_the_expert_axis_splitting_the_batch():
  dense = me.estimate(MOE.replace(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, moe_layers=None),
                      me.Mesh(1, 1, 1), WORK)
  moe = me.estimate(MOE, me.Mesh(1, 1, 1), WORK)
  # Layer 0 keeps, per token, router logits 4 x 4 bytes + (2 k D + 3 k F_moe) bf16 instead of 3 F: 8 x 8 tokens.
  per_token = 4 * 4 + (2 * 2 * 32 + 3 * 2 * 16) * 2 - 3 * 48 * 2
  assert moe["activations"] - dense["activations"] == 64 * per_token
  assert moe["kv_cache"] == dense["kv_cache"]
  # tensor 2 halves F_moe; expert 2 halves the rows (8 -> 4 per device), the KV cache's batch too.
  assert me.ffn_kept(MOE, 0, 2, 2) == 4 * 4 + (2 * 2 * 32 + 3 * 2 * 8) * 2
  assert me.ffn_kept(MOE, 1, 2, 2) == 3 * 24 * 2
  ep = me.estimate(MOE, me.Mesh(1, 1, 1, 2), WORK)
  assert ep["kv_cache"] * 2 == moe["kv_cache"]
  assert ep["activations"] - me.estimate(MOE, me.Mesh(1, 1, 1), WORK._replace(micro_batch=4))["activations"] == 0


def test_lora_on_experts_counts_the_model_adapters():
  """Rank 2 on every target: the estimate's adapters are the LoRAParams the model gets (E per expert projection)."""
  import jax
  from flax import nnx

  from grpo_jax.model import Transformer, lora
  est = me.estimate(MOE, me.Mesh(1, 1, 1), WORK._replace(lora_rank=2))
  model = nnx.eval_shape(lambda: lora.add_adapters(Transformer(MOE, rngs=nnx.Rngs(0)), lora.LoraConfig(2, 4.0),
                                                   nnx.Rngs(1)))
  assert est["trainable"] == sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
  # Layer 0's experts: 4 x 2 x ((32 + 16) x 2 + (16 + 32)), beside the attention's and layer 1's MLP adapters.
  assert me.lora_sizes(MOE, 2, "gate_proj,up_proj,down_proj", 0) == (4 * 2 * 3 * 48, 2 * (2 * (2 + 16) + 2 + 32))


@pytest.mark.parametrize("name, total, active", [("qwen3-30b-a3b", 30.5e9, 3.3e9), ("gpt-oss-20b", 20.91e9, 3.61e9),
                                                 ("gpt-oss-120b", 116.83e9, 5.13e9)])
def test_moe_presets_have_the_published_parameter_counts(name, total, active):
  """Qwen's 3.3B active counts the embedding table; OpenAI's 3.61B / 5.13B do not (a token reads one row of it)."""
  cfg = me.model_config(name, "bfloat16", "bfloat16")
  count = me.param_elements(cfg, me.Mesh(1, 1, 1))[0]
  assert abs(count / total - 1) < 0.02
  embedding = 0 if name.startswith("qwen") else cfg.vocab_size * cfg.hidden_size
  assert abs((me.active_params(cfg) - embedding) / active - 1) < 0.02


def test_plan_fits_the_largest_micro_batch_then_remat_off_or_says_it_does_not_fit(capsys):
  w = WORK._replace(sampler_batch=16)
  huge = me.plan(MOE, 4, 2 ** 40, w, group_size=4)
  assert huge.fits and huge.micro_batch == 16 and not huge.remat
  # One device: the budget of remat at the largest micro-batch takes remat; a little less, a smaller micro-batch.
  top = me.estimate(MOE, me.Mesh(1, 1, 1), w._replace(micro_batch=16, prompt_repeats=4))
  assert top["total_remat"] < top["total"]
  remat = me.plan(MOE, 1, top["total_remat"] / me.FIT_FRACTION, w, group_size=4)
  assert (remat.fits, remat.micro_batch, remat.remat, remat.bytes) == (True, 16, True, top["total_remat"])
  smaller = me.plan(MOE, 1, (top["total_remat"] - 1) / me.FIT_FRACTION, w, group_size=4)
  assert smaller.fits and smaller.micro_batch < 16 and smaller.bytes <= top["total_remat"] - 1
  # Four devices: the meshes keep the expert axis dividing E = 4 and take all the devices.
  assert sorted(me.meshes(8, 4)) == sorted(m for m in me.meshes(8, 8) if m.expert <= 4)
  assert all(math.prod(m) == 8 for m in me.meshes(8, 4)) and len(me.meshes(8, 1)) == 10
  none = me.plan(MOE, 4, 1000, w, group_size=4)
  assert not none.fits and none.bytes == min(
      me.estimate(MOE, m, w._replace(micro_batch=m.batch_ways, prompt_repeats=math.gcd(m.batch_ways, 4)))[
          "total_remat"]
      for m in me.meshes(4, 4))
  me.main(["--model", "qwen3-30b-a3b", "--param-dtype", "float32", "--plan", "--devices", "8",
           "--device-memory-gib", "16", "--sampler-batch", "256"])
  assert "does not fit" in capsys.readouterr().out


# A Qwen3.5-style hybrid: layers 0 and 2 Gated DeltaNet (Hk 2 of Dk 8, Hv 4 of Dv 4, 3 taps), layer 1 full attention.
HYBRID = CFG.replace(num_layers=3, family="qwen3_5_text", qk_norm=True, attention_output_gate=True,
                     partial_rotary_factor=0.5, layer_types=("linear_attention", "full_attention", "linear_attention"),
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=4,
                     linear_conv_kernel=3)


@pytest.mark.parametrize("tensor", [1, 2])
def test_hybrid_cache_is_the_samplers_and_its_adapters_the_models(tensor):
  import jax
  from flax import nnx

  from grpo_jax.model import Transformer, init_cache, lora
  est = me.estimate(HYBRID, me.Mesh(1, 1, tensor), WORK)
  cache = jax.eval_shape(lambda: init_cache(HYBRID, WORK.sampler_batch, WORK.prompt_len + WORK.new_tokens))
  assert est["kv_cache"] * tensor == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
  # By hand, per row: the full layer's 2 x 8 slots x 2 kv heads x 8 (bf16); each linear layer's window of
  # 2 x (2*2*8 + 4*4) channels (bf16) and state 4 x 8 x 4 (float32).
  assert est["kv_cache"] * tensor == 8 * (2 * 8 * 2 * 8 * 2 + 2 * (2 * 48 * 2 + 4 * 8 * 4 * 4))
  est = me.estimate(HYBRID, me.Mesh(1, 1, 1), WORK._replace(lora_rank=2))
  model = nnx.eval_shape(lambda: lora.add_adapters(Transformer(HYBRID, rngs=nnx.Rngs(0)), lora.LoraConfig(2, 4.0),
                                                   nnx.Rngs(1)))
  assert est["trainable"] == sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


# The small presets (tracing the 27B's 64 layers and the 31B's 60 takes ~10 s each; their counts are --table's).
@pytest.mark.parametrize("name", ["qwen3.5-0.8b"])
def test_qwen3_5_presets_count_by_hand(name):
  """Linear layer: in_proj_qkv D x (2 Hk Dk + Hv Dv), z D x Hv Dv, out Hv Dv x D, b and a D x Hv, conv 4 x C,
  A_log / dt_bias Hv, norm Dv; full layer: q and its gate D x N H each, k / v D x K H, o N H x D, q/k norms H."""
  cfg = me.model_config(name, "bfloat16", "bfloat16")
  D, F, L, N, K, H = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, 256
  Hv, Dk = cfg.linear_num_value_heads, 128
  C = 2 * 16 * Dk + Hv * 128
  linear = D * C + 2 * D * Hv * 128 + 2 * D * Hv + 4 * C + 2 * Hv + 128
  full = 3 * D * N * H + 2 * D * K * H + 2 * H
  layer = 3 * D * F + 2 * D
  embeddings = 248320 * D * (1 if cfg.tie_word_embeddings else 2)
  expected = embeddings + D + L // 4 * full + (L - L // 4) * linear + L * layer
  assert me.param_elements(cfg, me.Mesh(1, 1, 1))[0] == expected
  assert abs(expected / {"qwen3.5-0.8b": 0.75e9, "qwen3.5-27b": 26.9e9}[name] - 1) < 0.01


# A Gemma 4 shape: layers S F S F (window 3), the full ones with head_dim 16 and 1 kv head (against 8 and 2) and
# their values the keys (attention_k_eq_v); layers 2 and 3 read layers 0 and 1's keys and values and have a
# double-wide MLP; per-layer inputs of 4; the expert block (4 experts of 12, k 2) beside every MLP.
GEMMA4 = CFG.replace(num_layers=4, family="gemma4_text", qk_norm=True, query_pre_attn_scalar=1.0,
                     tie_word_embeddings=True, layer_types=("sliding_attention", "full_attention") * 2,
                     sliding_window=3, global_head_dim=16, global_num_kv_heads=1, attention_k_eq_v=True,
                     num_kv_shared_layers=2, double_wide_mlp=True, per_layer_input_size=4,
                     per_layer_input_vocab_size=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                     norm_topk_prob=True)


def test_gemma4_cache_is_the_samplers_and_its_adapters_the_models():
  import jax
  from flax import nnx

  from grpo_jax.model import Transformer, init_cache, lora
  est = me.estimate(GEMMA4, me.Mesh(1, 1, 1), WORK)
  cache = jax.eval_shape(lambda: init_cache(GEMMA4, WORK.sampler_batch, WORK.prompt_len + WORK.new_tokens))
  assert est["kv_cache"] == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
  # By hand, per row (bf16): layer 0's 3 slots x 2 (k, v) x 2 kv heads x 8, layer 1's 8 slots x 2 x 1 x 16, and
  # nothing for layers 2 and 3.
  assert est["kv_cache"] == 8 * 2 * (3 * 2 * 2 * 8 + 8 * 2 * 1 * 16)
  est = me.estimate(GEMMA4, me.Mesh(1, 1, 1), WORK._replace(lora_rank=2))
  model = nnx.eval_shape(lambda: lora.add_adapters(Transformer(GEMMA4, rngs=nnx.Rngs(0)), lora.LoraConfig(2, 4.0),
                                                   nnx.Rngs(1)))
  assert est["trainable"] == sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def _gemma4_layer(D, N, K, H, F, kv: bool, values: bool, P: int) -> int:
  """One Gemma 4 layer by hand: q D x N H, o N H x D, q_norm H; k D x K H and k_norm H unless it reads another's
  keys and values, v D x K H unless those are its keys too; MLP 3 D F; four norms D, layer_scalar 1; per-layer
  input gate D x P, projection P x D and its norm D when P > 0."""
  attention = 2 * D * N * H + H + (D * K * H + H if kv else 0) + (D * K * H if kv and values else 0)
  return attention + 3 * D * F + 4 * D + 1 + (2 * D * P + D if P else 0)


@pytest.mark.parametrize("name", ["gemma4-e2b"])
def test_gemma4_presets_count_by_hand(name):
  cfg = me.model_config(name, "bfloat16", "bfloat16")
  V = 262144
  if name == "gemma4-e2b":  # 35 layers, every 5th global; the last 20 share keys and values and are double-wide
    D, L, P, F = 1536, 35, 256, 6144
    layers = sum(_gemma4_layer(D, 8, 1, 512 if i % 5 == 4 else 256, 2 * F if i >= 15 else F, i < 15, True, P)
                 for i in range(L))
    table = V * L * P  # the per-layer input table, which "effective" parameters leave out
    top = V * D + D + table + D * L * P + P  # embeddings, final norm, per-layer input table and projection
    effective = layers + top - table
    # the model card's 2.3B effective; its 5.1B total holds the vision and audio towers as well
    assert abs(effective / 2.3e9 - 1) < 0.02
    published = effective + table
  else:  # 60 layers, every 6th global with 4 kv heads of 512 and no value projection
    D, L = 5376, 60
    layers = sum(_gemma4_layer(D, 32, 4 if i % 6 == 5 else 16, 512 if i % 6 == 5 else 256, 21504, True,
                               i % 6 != 5, 0) for i in range(L))
    top = V * D + D
    published = 30.7e9  # the model card's 30.7B (the vision tower adds ~0.5%)
  assert me.param_elements(cfg, me.Mesh(1, 1, 1))[0] == layers + top
  assert abs((layers + top) / published - 1) < 0.02
