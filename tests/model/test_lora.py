"""LoRA adapters (grpo_jax/model/lora.py) against independent references: the base model they start from, the
update W x + (alpha / r) x A B written out in numpy, and the merged weights."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.model import lora
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

CFG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=4, attention_bias=True)
B, T = 2, 6


def _inputs():
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (B, T)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(T), (B, T))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
  return tokens, positions, mask


def _adapted(config: lora.LoraConfig, cfg=CFG):
  return lora.add_adapters(Transformer(cfg, rngs=nnx.Rngs(0)), config, nnx.Rngs(1))


def _randomize_b(model, seed=5):
  """Every lora_b drawn N(0, 0.1²) (they start at zero, which would hide a wrong update)."""
  graphdef, params = nnx.split(model)
  adapters, base = lora.split_adapters(params)
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(adapters))))
  adapters = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), adapters)
  return nnx.merge(graphdef, lora.join(adapters, base))


@pytest.mark.parametrize("targets", [lora.TARGETS, ("q_proj", "v_proj"), ("down_proj",)])
def test_zero_initialized_b_gives_the_base_model_and_the_base_graphdef_reads_the_base(targets):
  base = Transformer(CFG, rngs=nnx.Rngs(0))
  model = _adapted(lora.LoraConfig(rank=3, alpha=6.0, targets=targets))
  inputs = _inputs()
  expected = np.asarray(base(*inputs)[0])
  np.testing.assert_array_equal(np.asarray(model(*inputs)[0]), expected)
  graphdef, params = nnx.split(model)
  _, base_params = lora.split_adapters(params)
  # The same base weights (the adapters draw from their own stream) and the same state layout as a plain model.
  assert jax.tree.structure(base_params) == jax.tree.structure(nnx.split(base)[1])
  np.testing.assert_array_equal(np.asarray(nnx.merge(lora.base_graphdef(graphdef, params), base_params)(
      *inputs)[0]), expected)
  # Still the base with random (nonzero) adapters: the base graphdef switches them off.
  graphdef, params = nnx.split(_randomize_b(model))
  np.testing.assert_array_equal(np.asarray(nnx.merge(lora.base_graphdef(graphdef, params),
                                                     lora.split_adapters(params)[1])(*inputs)[0]), expected)


def test_adapter_update_matches_numpy():
  config = lora.LoraConfig(rank=2, alpha=5.0, targets=("q_proj",))
  sizes = lora.layer_projection_sizes(CFG, 0)[0][0]  # the attention block's
  adapters = lora.LayerAdapters({"q_proj": sizes["q_proj"], "o_proj": sizes["o_proj"]}, config, CFG,
                                rngs=nnx.Rngs(2))
  a = np.asarray(adapters.q_proj.lora_a[...], np.float64)
  b = np.random.default_rng(1).normal(size=adapters.q_proj.lora_b.shape)
  adapters.q_proj.lora_b[...] = jnp.asarray(b, jnp.float32)
  x = np.random.default_rng(2).normal(size=(B, T, CFG.hidden_size))
  y = np.random.default_rng(3).normal(size=(B, T, CFG.num_heads, CFG.head_dim))
  expected = y + (5.0 / 2) * (x @ a @ b).reshape(y.shape)
  got = adapters.add("q_proj", jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
  assert_close_f32(got, expected, ulps=8)  # float32 inputs and x @ a @ b: 0.9 ulps of the largest seen, 7 the old atol
  # A projection without an adapter passes through.
  np.testing.assert_array_equal(np.asarray(adapters.add("o_proj", jnp.asarray(x, jnp.float32), got)),
                                np.asarray(got))


def test_merged_model_computes_the_adapted_model_and_leaves_it_unchanged():
  model = _randomize_b(_adapted(lora.LoraConfig(rank=4, alpha=8.0)))
  inputs = _inputs()
  adapted = np.asarray(model(*inputs)[0])
  base = np.asarray(Transformer(CFG, rngs=nnx.Rngs(0))(*inputs)[0])
  assert np.abs(adapted - base).max() > 0.1  # the adapters change the output: the comparison below means something
  merged = lora.merged(model)
  assert not lora.has_adapters(merged) and lora.has_adapters(model)
  # W + s·A·B folded in against x @ W + s·x @ A @ B, through 2 layers: 3.4 ulps seen, 74 the old atol.
  assert_close_f32(merged(*inputs)[0], adapted, ulps=128)
  assert jax.tree.structure(nnx.split(merged)[1]) == jax.tree.structure(
      nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))[1])
  np.testing.assert_array_equal(np.asarray(model(*inputs)[0]), adapted)


def test_adapters_in_the_cached_decode_path_match_the_full_forward():
  model = _randomize_b(_adapted(lora.LoraConfig(rank=2, alpha=4.0)))
  tokens, positions, mask = _inputs()
  full = np.asarray(model(tokens, positions, mask)[0])
  from grpo_jax.model.transformer import init_cache
  cache = init_cache(CFG, B, T)
  steps = []
  for t in range(T):
    hidden, cache = model(tokens[:, t:t + 1], positions[:, t:t + 1], mask[:, t:t + 1], cache=cache, cache_index=t)
    steps.append(np.asarray(hidden))
  assert_close_f32(np.concatenate(steps, axis=1), full, ulps=128)  # cached against whole: 3.4 ulps seen, 73 old atol


def test_counts_and_targets():
  config = lora.LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "down_proj"))
  _, params = nnx.split(_adapted(config))
  n_adapters, n_all = lora.count(params)
  D, F, NH = CFG.hidden_size, CFG.intermediate_size, CFG.num_heads * CFG.head_dim
  assert n_adapters == CFG.num_layers * 4 * ((D + NH) + (F + D))
  assert n_all == n_adapters + sum(x.size for x in jax.tree.leaves(nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))[1]))
  assert lora.parse_targets("all") == lora.TARGETS
  assert lora.parse_targets(" v_proj,q_proj ") == ("q_proj", "v_proj")
  with pytest.raises(ValueError, match="qproj"):
    lora.parse_targets("qproj,v_proj")
  with pytest.raises(ValueError, match="rank"):
    lora.LoraConfig(rank=0, alpha=1.0)


# Gemma 4 with every geometry an adapter must follow: global layers (1, 3) with head_dim 8 and 1 kv head against
# 4 and 2, attention_k_eq_v (no v_proj on 1), the last 2 layers reading layers 0 and 1's keys and values (no k/v
# projections), double-wide MLPs on those, per-layer inputs, and the expert block beside every MLP.
GEMMA4 = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=12, num_layers=4, num_heads=4, num_kv_heads=2,
                     head_dim=4, family="gemma4_text", qk_norm=True, query_pre_attn_scalar=1.0,
                     tie_word_embeddings=True, layer_types=("sliding_attention", "full_attention") * 2,
                     sliding_window=3, global_head_dim=8, global_num_kv_heads=1, attention_k_eq_v=True,
                     num_kv_shared_layers=2, double_wide_mlp=True, per_layer_input_size=4,
                     per_layer_input_vocab_size=32, final_logit_softcapping=30.0, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=6, norm_topk_prob=True)


def test_gemma4_adapters_follow_each_blocks_weights_start_at_the_base_and_merge():
  base = Transformer(GEMMA4, rngs=nnx.Rngs(0))
  model = _adapted(lora.LoraConfig(rank=2, alpha=4.0), GEMMA4)
  layers = model.layers
  # Each adapter has its weight's sizes; a missing weight has none.
  assert layers[0].attn.adapters.names == ("q_proj", "k_proj", "v_proj", "o_proj")
  assert layers[1].attn.adapters.names == ("q_proj", "k_proj", "o_proj")  # k_eq_v: values are the keys
  assert layers[2].attn.adapters.names == layers[3].attn.adapters.names == ("q_proj", "o_proj")  # shared k/v
  assert layers[1].attn.adapters.k_proj.lora_b.shape == (2, 1 * 8)
  assert layers[1].attn.adapters.o_proj.lora_a.shape == (4 * 8, 2)
  assert layers[3].mlp.adapters.gate_proj.lora_b.shape == (2, 2 * 12)  # double-wide
  assert layers[0].experts.adapters.down_proj_a.shape == (4, 6, 2)
  # The config's per-layer sizes (what memory_estimate counts) are those read from the weights.
  _, params = nnx.split(model)
  expected = sum((GEMMA4.num_experts if experts else 1) * 2 * (d_in + d_out) for i in range(GEMMA4.num_layers)
                 for sizes, experts in lora.layer_projection_sizes(GEMMA4, i) for d_in, d_out in sizes.values())
  assert lora.count(params)[0] == expected
  inputs = _inputs()
  logits = lambda m: np.asarray(m.logits(m(*inputs)[0]))
  base_logits = logits(base)
  np.testing.assert_array_equal(logits(model), base_logits)
  adapted_model = _randomize_b(model)
  adapted = logits(adapted_model)
  assert np.abs(adapted - base_logits).max() > 0.1
  merged = lora.merged(adapted_model)
  assert jax.tree.structure(nnx.split(merged)[1]) == jax.tree.structure(nnx.split(base)[1])
  # float32: the merged weights round once where the adapted model adds two products, and Gemma 4's q / k / v norms
  # rescale projections of weights ~0.02 to unit RMS, that rounding with them (worst seen: 3.4e-6 at scale 0.2,
  # 130 ulps).
  assert_close_f32(logits(merged), adapted, ulps=512)
