"""Mixtures of experts (Qwen3-MoE, gpt-oss) against transformers' PyTorch models on the same random weights, and the
grouped (ragged_dot) expert path against the dense all-experts reference."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import ModelConfig, Transformer, hf_io
from grpo_jax.model.config import from_hf_config
from grpo_jax.model import moe as moe_lib
from grpo_jax.model.moe import MoE, dense_experts, expert_load, grouped_experts, replayed_weights, route
from .helpers import VOCAB, jitted_logits as jax_logits, left_padded_batch, saved_on_first_use, torch_logits
from .test_gemma3 import _sampler_greedy, torch_greedy
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

YARN = dict(rope_type="yarn", rope_theta=150_000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
            original_max_position_embeddings=4096)
# name -> (config class, kwargs). Expert counts, k, norm_topk_prob both ways, dense layers by mlp_only_layers and by
# decoder_sparse_step, windows shorter than the sequences, YaRN with and without truncation, GQA 2:1 and 4:1.
SHAPES = {
    "qwen3_moe_e6k2_norm_dense1": ("Qwen3MoeConfig", dict(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
        moe_intermediate_size=24, num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1])),
    "qwen3_moe_e8k3_step2": ("Qwen3MoeConfig", dict(
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=16, intermediate_size=40,
        moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2)),
    "gpt_oss_e4k2_w5": ("GptOssConfig", dict(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=24,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=5, rope_parameters={**YARN, "truncate": False})),
    "gpt_oss_e8k4_w3": ("GptOssConfig", dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16, intermediate_size=20,
        num_local_experts=8, num_experts_per_tok=4, sliding_window=3, rope_parameters=YARN)),
}


def build_torch_moe(name: str, seed: int = 0):
  import torch
  import transformers
  cls_name, kw = SHAPES[name]
  config = getattr(transformers, cls_name)(vocab_size=VOCAB, hidden_size=32, attn_implementation="eager", **kw)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  with torch.no_grad():  # every tensor random (norm scales around 1, biases and sinks non-zero)
    for pname, p in model.named_parameters():
      if p.ndim == 1 and not pname.endswith(("bias", "sinks")):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (directory, torch model), built on first use."""
  return saved_on_first_use(tmp_path_factory, build_torch_moe)


@pytest.mark.parametrize("name", list(SHAPES))
def test_logits_match_transformers_with_left_padding(checkpoints, name):
  path, torch_model = checkpoints(name)
  tokens, mask = left_padded_batch(np.random.default_rng(0), (20, 13, 6), 20)
  model = hf_io.from_pretrained(path)
  assert name.startswith(model.cfg.family) and model.cfg.num_experts
  ref = torch_logits(torch_model, tokens, mask)
  # Every expert path on one shape per family (the grouped ones against the dense one: test_grouped_experts_...).
  for impl in ("ragged", "blocks", "dense") if name in ("qwen3_moe_e6k2_norm_dense1", "gpt_oss_e4k2_w5") else ("auto",):
    ours = jax_logits(hf_io.from_pretrained(path, moe_impl=impl), tokens, mask)
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=0, err_msg=impl)


@pytest.mark.parametrize("name", ["qwen3_moe_e8k3_step2", "gpt_oss_e4k2_w5", "gpt_oss_e8k4_w3"])
def test_greedy_32_tokens_equal_transformers_generate(checkpoints, name):
  """The sampler's KV cache (ring buffers for gpt-oss's windows), left-padded prompts longer and shorter than them."""
  path, torch_model = checkpoints(name)
  rng = np.random.default_rng(3)
  prompts = [list(rng.integers(1, VOCAB, size=n)) for n in (11, 3, 7)]
  sampler, ours = _sampler_greedy(hf_io.from_pretrained(path), prompts, 32)
  assert sampler.last_num_steps == 32
  np.testing.assert_array_equal(ours.completion_BxC, torch_greedy(torch_model, prompts, 32))


@pytest.mark.parametrize("name", ["qwen3_moe_e6k2_norm_dense1", "gpt_oss_e4k2_w5"])
def test_export_loads_in_transformers_to_the_same_logits(checkpoints, name, tmp_path):
  import transformers
  path, torch_model = checkpoints(name)
  hf_io.save_pretrained(hf_io.from_pretrained(path), tmp_path, max_shard_bytes=20_000)  # sharded: 2 files at least
  assert len(list(tmp_path.glob("model-*.safetensors"))) >= 2
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
  tokens, mask = left_padded_batch(np.random.default_rng(1), (12, 5), 12)
  np.testing.assert_array_equal(torch_logits(back, tokens, mask), torch_logits(torch_model, tokens, mask))
  assert from_hf_config(hf_io.read_hf_config(tmp_path)) == hf_io.from_pretrained(path).cfg


def _moe(router="softmax_topk", norm=False, bias=False, E=8, k=2, seed=0):
  cfg = ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                    head_dim=8, num_experts=E, num_experts_per_tok=k, moe_intermediate_size=12, router=router,
                    norm_topk_prob=norm, expert_bias=bias, swiglu_limit=7.0 if bias else None)
  moe = MoE(cfg, rngs=nnx.Rngs(seed))
  for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(moe, nnx.Param))):  # biases non-zero, weights O(1)
    shape = var.get_value().shape
    var.set_value(jax.random.normal(jax.random.key(i), shape) * (0.3 if len(shape) < 3 else 1))
  return moe


@pytest.mark.parametrize("router,norm,bias", [("softmax_topk", False, False), ("softmax_topk", True, False),
                                              ("topk_softmax", False, True)])
def test_route_matches_numpy(router, norm, bias):
  moe = _moe(router, norm, bias)
  logits = np.asarray(jax.random.normal(jax.random.key(5), (40, 8)), np.float64)
  weights, experts = route(jnp.asarray(logits, jnp.float32), moe.cfg)
  top = np.argsort(-logits, axis=-1)[:, :2]  # softmax is monotone: the same k experts either way
  np.testing.assert_array_equal(np.asarray(experts), top)
  chosen = np.take_along_axis(logits, top, -1)
  if router == "topk_softmax":
    want = np.exp(chosen) / np.exp(chosen).sum(-1, keepdims=True)
  else:
    want = np.exp(chosen) / np.exp(logits).sum(-1, keepdims=True)
    if norm:
      want = want / want.sum(-1, keepdims=True)
  assert_close_f32(weights, want, ulps=8)  # a softmax over 8 logits: 0.75 ulps of the largest weight seen
  # Replaying the router's own choice gives the router's weights.
  np.testing.assert_allclose(np.asarray(replayed_weights(jnp.asarray(logits, jnp.float32), experts, moe.cfg)),
                             np.asarray(weights), rtol=1e-6)


@pytest.mark.parametrize("blocks", [False, True])
@pytest.mark.parametrize("router,norm,bias", [("softmax_topk", True, False), ("topk_softmax", False, True)])
def test_grouped_experts_equal_the_dense_reference_values_and_gradients(router, norm, bias, blocks):
  """With experts that get no token at all (8 experts, the router biased towards three of them)."""
  moe = _moe(router, norm, bias)
  grouped = functools.partial(grouped_experts, blocks=blocks)
  x = jax.random.normal(jax.random.key(1), (2, 13, 16))
  graphdef, state = nnx.split(moe)

  def loss(state, x, ffn):
    m = nnx.merge(graphdef, state)
    flat = x.reshape(-1, 16)
    logits = m.router_logits(flat) + jnp.array([4.0, 4.0, 4.0, 0, 0, 0, 0, 0]) * (1 - (router == "topk_softmax"))
    weights, experts = route(logits, m.cfg)
    y = ffn(m, flat, weights, experts)
    return jnp.sum(jnp.sin(y)), y

  (lg, yg), gg = jax.value_and_grad(loss, has_aux=True)(state, x, grouped)
  (ld, yd), gd = jax.value_and_grad(loss, has_aux=True)(state, x, dense_experts)
  scale = float(jnp.abs(yd).max())
  np.testing.assert_allclose(np.asarray(yg), np.asarray(yd), atol=64 * np.finfo(np.float32).eps * scale, rtol=0)
  for (path, a), (_, b) in zip(nnx.to_flat_state(gg), nnx.to_flat_state(gd)):
    b = np.asarray(b.get_value())
    np.testing.assert_allclose(np.asarray(a.get_value()), b, atol=256 * np.finfo(np.float32).eps * np.abs(b).max(),
                               rtol=0, err_msg=str(path))
  assert float(np.abs(np.asarray(gd["router_DxE"].get_value())).max()) > 0  # the router learns through the weights


def test_the_grouped_paths_cost_the_routed_rows_not_every_expert():
  """The grouped paths' activations have R = T * k rows (blocks: R / b + E blocks of b rows), never a [T, E, F]
  array (the dense reference has one); the blocks' matmuls total at most R + E b rows."""
  moe = _moe(E=8, k=2)
  T, R = 256, 512
  x = jnp.ones((T, 16))
  w, e = route(moe.router_logits(x), moe.cfg)
  shapes = lambda fn: {tuple(v.aval.shape) for eq in jax.make_jaxpr(lambda x: fn(moe, x, w, e))(x).eqns
                       for v in eq.outvars}
  b = moe_lib.block_rows(R, 8)
  assert b == 16
  assert (T, 8, 12) in shapes(dense_experts) and (R, 12) in shapes(grouped_experts)
  assert (R // b + 8, b, 12) in shapes(functools.partial(grouped_experts, blocks=True))
  for fn in (grouped_experts, functools.partial(grouped_experts, blocks=True)):
    assert not any(len(s) == 3 and s[:2] == (T, 8) for s in shapes(fn))


def test_replayed_experts_change_the_output_and_keep_the_router_gradient():
  moe = _moe("softmax_topk", True)
  x = jax.random.normal(jax.random.key(2), (1, 9, 16))
  own = route(moe.router_logits(x.reshape(9, 16)), moe.cfg)[1].reshape(1, 9, 2)
  y = np.asarray(moe(x))
  np.testing.assert_allclose(np.asarray(moe(x, own)), y, atol=8 * np.finfo(np.float32).eps * np.abs(y).max(), rtol=0)
  other = (own + 3) % 8
  assert np.abs(np.asarray(moe(x, other) - moe(x))).max() > 1e-3
  graphdef, state = nnx.split(moe)
  grad = jax.grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(x, other) ** 2))(state)
  assert np.abs(np.asarray(grad["router_DxE"].get_value())).max() > 0


def test_expert_load():
  experts = jnp.array([[0, 1], [0, 2], [0, 1], [3, 3]])  # counts 3, 2, 1, 2 over 4 experts (mean 2)
  assert float(expert_load(experts, 4)) == pytest.approx(1.5)
  assert float(expert_load(experts, 4, valid_T=jnp.array([1.0, 1.0, 1.0, 0.0]))) == pytest.approx(3 / 1.5)


@pytest.mark.parametrize("hf,message", [
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}, "Qwen3-MoE and gpt-oss are the supported"),
    ({"model_type": "deepseek_v3"}, "Qwen3-MoE and gpt-oss are the supported"),
    ({"model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}}, "'mxfp4': quantized weights"),
])
def test_other_moe_families_and_quantized_experts_are_named(hf, message):
  with pytest.raises(ValueError, match=message):
    from_hf_config(hf)


def test_expert_shards_give_the_same_logits_and_step(checkpoints):
  """1, 2 and 4 'expert' shards on 4 virtual CPU devices (worker: expert_worker.py): expert weights split by expert,
  the same logits and the same gradient step as one shard (float32 summation order only)."""
  from pathlib import Path
  from tests.virtual_devices import run_worker
  path, _ = checkpoints("qwen3_moe_e8k3_step2")
  out = run_worker(Path(__file__).with_name("expert_worker.py"), str(path), devices=4)
  assert [out[e]["gate_shard"][0] for e in ("1", "2", "4")] == [8, 4, 2]  # experts per shard
  one = out["1"]
  eps = float(np.finfo(np.float32).eps)
  for e in ("2", "4"):
    logits, params = np.asarray(out[e]["logits"]), np.asarray(out[e]["params"])
    # Summation order only: equal here, 21 ulps the old atol.
    assert_close_f32(logits, np.asarray(one["logits"]), ulps=32)
    assert out[e]["loss"] == pytest.approx(one["loss"], abs=64 * eps * abs(one["loss"]))
    np.testing.assert_allclose(params, one["params"], atol=64 * eps * np.abs(one["params"]).max(), rtol=0)


def test_lora_on_experts_starts_at_the_base_matches_the_dense_path_and_merges(checkpoints):
  """Rank-4 adapters on attention and every expert's projections: zero B gives the base logits; with random B the
  grouped and dense paths agree, and the merged model (what export writes) computes the adapted one."""
  from grpo_jax.model import lora
  path, _ = checkpoints("gpt_oss_e4k2_w5")
  tokens, mask = left_padded_batch(np.random.default_rng(2), (10, 4), 10)
  base = jax_logits(hf_io.from_pretrained(path), tokens, mask)
  config = lora.LoraConfig(rank=4, alpha=8.0)
  adapted = {impl: lora.add_adapters(hf_io.from_pretrained(path, moe_impl=impl), config, nnx.Rngs(params=7))
             for impl in ("ragged", "blocks", "dense")}
  eps, scale = float(np.finfo(np.float32).eps), np.abs(base[mask]).max()
  np.testing.assert_allclose(jax_logits(adapted["ragged"], tokens, mask)[mask], base[mask], atol=64 * eps * scale)
  experts = adapted["ragged"].layers[0].mlp.adapters
  assert isinstance(experts, lora.ExpertAdapters) and experts.gate_proj_a.get_value().shape == (4, 32, 4)
  for model in adapted.values():  # the same random B in both
    for i, (p, var) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))):
      if p[-1].endswith("_b") or p[-1] == "lora_b":
        var.set_value(0.3 * jax.random.normal(jax.random.key(i), var.get_value().shape))
  ragged, blocks, dense = (jax_logits(adapted[k], tokens, mask) for k in ("ragged", "blocks", "dense"))
  assert np.abs(ragged - base)[mask].max() > 0.1  # the adapters matter
  for grouped in (ragged, blocks):
    np.testing.assert_allclose(grouped[mask], dense[mask], atol=64 * eps * np.abs(dense[mask]).max())
  merged = jax_logits(lora.merged(adapted["ragged"]), tokens, mask)
  np.testing.assert_allclose(merged[mask], ragged[mask], atol=1e-4)


def test_load_balancing_loss_matches_transformers_and_z_loss_numpy():
  import torch
  from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
  from grpo_jax.model.moe import load_balancing_loss, router_z_loss
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(3, 7, 6)).astype(np.float32) * 2
  mask = np.arange(7)[None] >= np.array([0, 2, 5])[:, None]
  cfg = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                    head_dim=8, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=4)
  _, experts = route(jnp.asarray(logits.reshape(-1, 6)), cfg)
  ours = load_balancing_loss(jnp.asarray(logits.reshape(-1, 6)), experts, jnp.asarray(mask.reshape(-1)))
  ref = load_balancing_loss_func((torch.tensor(logits.reshape(-1, 6)),), 6, 2, torch.tensor(mask.astype(np.int64)))
  assert float(ours) == pytest.approx(float(ref), rel=1e-5)
  lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  assert float(router_z_loss(jnp.asarray(logits.reshape(-1, 6)), jnp.asarray(mask.reshape(-1)))) == pytest.approx(
      (lse ** 2)[mask].mean(), rel=1e-5)


def test_update_logs_expert_load_and_adds_the_auxiliary_losses():
  """A GRPO update of a fresh MoE model: moe/* metrics, and the auxiliary losses' coefficients add exactly
  coef * loss to the update's loss (one micro-batch, on-policy) and change the router's step."""
  import optax
  from grpo_jax.algo.objective import LossConfig
  from grpo_jax.train.step import RolloutBatch, make_train_step
  cfg = ModelConfig(vocab_size=14, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                    head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                    moe_layers=(False, True), family="qwen3_moe", qk_norm=True)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  B, P, C = 4, 5, 3
  pm = (np.arange(P)[None] >= np.array([0, 1, 2, 3])[:, None]).astype(np.int32)
  batch = RolloutBatch(rng.integers(1, 14, (B, P)).astype(np.int32) * pm, pm,
                       rng.integers(1, 14, (B, C)).astype(np.int32), np.ones((B, C), np.int32),
                       rng.normal(size=B).astype(np.float32), np.zeros((B, C), np.float32), None)

  def step(coefs):
    fn = make_train_step(graphdef, optax.sgd(1.0), LossConfig(beta=0.0, aggregation="token_mean"), num_iterations=1,
                         mini_batch_size=B, micro_batch_size=B, temperature=1.0, chunk_size=8, moe_loss_coefs=coefs)
    return jax.jit(fn)(jax.tree.map(jnp.array, params), optax.sgd(1.0).init(params), batch)

  p0, _, m0 = step((0.0, 0.0))
  p1, _, m1 = step((0.5, 0.25))
  assert set(m0) >= {"moe/expert_load", "moe/expert_load/1", "moe/aux_loss", "moe/z_loss"}
  assert 1.0 <= float(m0["moe/expert_load"]) <= 2.0  # 4 experts, 2 per token: max / mean at most E / k
  assert float(m0["moe/aux_loss"]) == pytest.approx(2.0, abs=0.05)  # k where router probabilities are uniform (init)
  added = 0.5 * float(m0["moe/aux_loss"]) + 0.25 * float(m0["moe/z_loss"])
  assert float(m1["loss"]) == pytest.approx(float(m0["loss"]) + added, rel=1e-5, abs=1e-6)
  router = lambda p: np.asarray(p["layers"][1]["mlp"]["router_DxE"].get_value())
  assert np.abs(router(p1) - router(p0)).max() > 1e-4


def test_the_sampler_records_its_experts_and_the_update_flips_and_replays_them(checkpoints):
  """The sampler's recorded experts are those of the trainer's forward (float32: routing_flip 0); changing a
  layer's recorded experts on real tokens shows up in routing_flip as exactly the changed share, and routing
  replay makes the trainer's log-probs follow the recorded experts."""
  import optax
  from grpo_jax.algo.objective import LossConfig
  from grpo_jax.model.logprobs import completion_logprobs
  from grpo_jax.train.step import RolloutBatch, make_logprob_fn, make_train_step
  path, _ = checkpoints("qwen3_moe_e6k2_norm_dense1")
  model = hf_io.from_pretrained(path)
  rng = np.random.default_rng(5)
  prompts = [list(rng.integers(1, VOCAB, size=n)) for n in (7, 4)]
  sampler, out = _sampler_greedy(model, prompts, 6)
  B, P, C = out.completion_BxC.shape[0], out.prompt_BxP.shape[1], 6
  assert out.experts_BxTxLxk.shape == (B, P + C, 2, 2)  # layers 0 and 2 are expert layers (1 is dense)
  cmask = np.ones((B, C), np.int32)
  batch = RolloutBatch(out.prompt_BxP, out.prompt_mask_BxP, out.completion_BxC, cmask,
                       np.array([1.0, -1.0], np.float32), out.logp_BxC, None, out.experts_BxTxLxk)
  graphdef, params = nnx.split(model)

  def flips(batch, replay=False):
    fn = make_train_step(graphdef, optax.sgd(0.0), LossConfig(beta=0.0), num_iterations=1, mini_batch_size=B,
                         micro_batch_size=B, temperature=1.0, chunk_size=8, routing_replay=replay)
    return float(jax.jit(fn)(params, optax.sgd(0.0).init(params), batch)[2]["moe/routing_flip"])

  assert flips(batch) == 0.0
  changed = np.array(out.experts_BxTxLxk)
  changed[0, P:P + 3, 1] = (changed[0, P:P + 3, 1] + 1) % 6  # layer 2's experts of 3 fed completion tokens of row 0
  while np.any(np.sort(changed[0, P:P + 3, 1], -1) == np.sort(out.experts_BxTxLxk[0, P:P + 3, 1], -1)):
    changed[0, P:P + 3, 1] = (changed[0, P:P + 3, 1] + 1) % 6
  fed = out.prompt_mask_BxP.sum() + B * (C - 1)  # every real prompt token, every completion token but the last
  assert flips(batch._replace(experts_BxTxLxk=changed)) == pytest.approx(3 / (2 * fed))
  logp = lambda replay, b: np.asarray(jax.jit(make_logprob_fn(graphdef, temperature=1.0, chunk_size=8,
                                                             micro_batch_size=B, routing_replay=replay))(params, b))
  plain = logp(False, batch)
  # Replaying its own choice changes nothing (another program: equal here, 31 ulps the old atol).
  assert_close_f32(logp(True, batch), plain, ulps=32)
  np.testing.assert_allclose(plain, out.logp_BxC, atol=1e-4)
  replayed = logp(True, batch._replace(experts_BxTxLxk=changed))
  assert np.abs(replayed[0, 1:4] - plain[0, 1:4]).max() > 1e-3  # tokens after the changed ones follow them
  assert_close_f32(replayed[1], plain[1], ulps=64)  # row 1 untouched (equal here, 34 ulps the old atol)
  assert np.abs(replayed[0, 0] - plain[0, 0]) < 1e-5  # token 0 is predicted before any changed token


def test_every_registered_loss_and_aggregation_updates_a_moe_model():
  """Each registered policy loss and aggregation (paired cyclically), GSPO's sequence ratio and a k3 KL term: one
  update of a fresh MoE model with replayed experts gives a finite loss, moves the experts and the router."""
  import itertools
  import optax
  from grpo_jax.algo.aggregation import AGGREGATIONS
  from grpo_jax.algo.objective import LossConfig
  from grpo_jax.algo.registry import list_losses
  from grpo_jax.train.step import RolloutBatch, make_train_step
  cfg = ModelConfig(vocab_size=14, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                    head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(1)
  B, P, C = 4, 3, 3
  experts = rng.integers(0, 4, (B, P + C, 1, 2)).astype(np.int16)
  experts[..., 1] = (experts[..., 0] + 1) % 4  # two distinct experts per token
  batch = RolloutBatch(rng.integers(1, 14, (B, P)).astype(np.int32), np.ones((B, P), np.int32),
                       rng.integers(1, 14, (B, C)).astype(np.int32), np.ones((B, C), np.int32),
                       np.array([1.0, -1.0, 0.5, -0.5], np.float32), np.full((B, C), -2.0, np.float32),
                       np.full((B, C), -2.5, np.float32), experts)
  pairs = list(itertools.islice(zip(itertools.cycle(list_losses()), itertools.cycle(AGGREGATIONS.names())),
                                max(len(list_losses()), len(AGGREGATIONS.names()))))
  configs = [LossConfig(policy_loss=loss, aggregation=agg, beta=0.0) for loss, agg in pairs]
  configs += [LossConfig(importance_level="sequence", epsilon_low=3e-4, epsilon_high=4e-4, beta=0.0),
              LossConfig(beta=0.04, kl_estimator="k3")]
  for loss_cfg in configs:
    fn = make_train_step(graphdef, optax.sgd(0.1), loss_cfg, num_iterations=1, mini_batch_size=B, micro_batch_size=B,
                         temperature=1.0, chunk_size=8, routing_replay=True)
    new, _, metrics = jax.jit(fn)(jax.tree.map(jnp.array, params), optax.sgd(0.1).init(params), batch)
    assert np.isfinite(float(metrics["loss"])) and "moe/routing_flip" in metrics, loss_cfg
    moved = lambda name: np.abs(np.asarray(new["layers"][0]["mlp"][name].get_value())
                                - np.asarray(params["layers"][0]["mlp"][name].get_value())).max()
    assert moved("gate_ExDxF") > 0 and moved("router_DxE") > 0, loss_cfg
