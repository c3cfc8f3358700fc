"""LoRA training (model.lora_rank > 0): the update moves only the adapters, by the same gradient full fine-tuning
gives them; the optimizer state shrinks to the adapters'; remat and the reference (the base, adapters off) work;
a run checkpoints the adapters, resumes exactly and exports the merged model."""
from __future__ import annotations

import ast
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax.algo.objective import LossConfig
from grpo_jax.model import ModelConfig, Transformer, hf_io
from grpo_jax.model import lora
from grpo_jax.model import sharding as sharding_lib
from grpo_jax.persist import checkpoint as checkpoint_lib
from grpo_jax.train import export as export_lib
from grpo_jax.settings import Settings
from grpo_jax.train import build, loop
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.metrics import read_jsonl
from grpo_jax.train.step import RolloutBatch, make_train_step
from grpo_jax.train import checks
from grpo_jax.model.transformer import cast_for_compute
from grpo_jax.train.inputs import RunInputs
from grpo_jax.train.producer import Producer
from grpo_jax.train.run import Run
from tests.tolerance import assert_close_f32
from tests.train.conftest import load_experiment

pytestmark = pytest.mark.usefixtures("float32_matmuls")

B, P, C = 8, 4, 5
CFG = ModelConfig(vocab_size=14, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                  head_dim=8, max_position_embeddings=32)


def _batch() -> RolloutBatch:
  rng = np.random.default_rng(0)
  prompt = rng.integers(2, CFG.vocab_size, (B, P)).astype(np.int32)
  completion = rng.integers(1, CFG.vocab_size, (B, C)).astype(np.int32)
  mask = (np.arange(C)[None] < rng.integers(1, C + 1, B)[:, None]).astype(np.int32)
  return RolloutBatch(prompt, np.ones((B, P), np.int32), completion * mask, mask,
                      rng.normal(size=B).astype(np.float32), np.zeros((B, C), np.float32), None)


def _adapted_state(cfg=CFG):
  """(graphdef, params) of an adapted model whose lora_b are nonzero (so both A and B get gradients)."""
  graphdef, params = nnx.split(lora.add_adapters(Transformer(cfg, rngs=nnx.Rngs(0)), lora.LoraConfig(2, 4.0),
                                                 nnx.Rngs(1)))
  adapters, base = lora.split_adapters(params)
  adapters = jax.tree.map(lambda x: x + 0.05 * jnp.ones_like(x), adapters)
  return graphdef, lora.join(adapters, base)


def _step(graphdef, optimizer, trainable, **kw):
  return jax.jit(make_train_step(graphdef, optimizer, LossConfig(beta=0.0), num_iterations=1, mini_batch_size=B,
                                 micro_batch_size=4, temperature=1.0, chunk_size=128, trainable=trainable, **kw))


def test_only_adapters_move_and_by_the_full_fine_tuning_gradient():
  graphdef, params = _adapted_state()
  batch = _batch()
  sgd = optax.sgd(0.5)
  adapters0, base0 = lora.split_adapters(params)
  # Reference: every parameter trained with plain SGD (the adapters' update does not depend on the others').
  full, _, _ = _step(graphdef, sgd, None)(params, sgd.init(params), batch)
  trained, opt_state, metrics = _step(graphdef, sgd, nnx.LoRAParam)(params, sgd.init(adapters0), batch)
  adapters_full, base_full = lora.split_adapters(full)
  adapters1, base1 = lora.split_adapters(trained)
  assert jax.tree.structure(trained) == jax.tree.structure(params)
  for x, y in zip(jax.tree.leaves(base1), jax.tree.leaves(base0)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  moved = [float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(base_full), jax.tree.leaves(base0))]
  assert max(moved) > 1e-4  # the loss does reach the base weights: freezing them is what kept them
  for x, y, x0 in zip(jax.tree.leaves(adapters1), jax.tree.leaves(adapters_full), jax.tree.leaves(adapters0)):
    assert float(jnp.abs(x - x0).max()) > 0
    # One SGD step through two programs: equal here; 256 ulps, the old atol at leaves of ~0.05.
    assert_close_f32(x, y, ulps=256)
  assert np.isfinite(float(metrics["grad_norm"]))


def test_optimizer_state_holds_only_the_adapters():
  _, params = _adapted_state()
  adam = optax.adam(1e-3)
  size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  full_state, lora_state = adam.init(params), adam.init(lora.split_adapters(params)[0])
  n_adapters, n_all = lora.count(params)
  moments = lambda state: size(state) - 1  # two moments per parameter and one step count
  assert moments(full_state) == 2 * n_all and moments(lora_state) == 2 * n_adapters
  print(f"AdamW moments: {2 * n_adapters} with LoRA rank 2 vs {2 * n_all} in full fine-tuning "
        f"({n_all / n_adapters:.1f}x smaller)")


def test_remat_gives_the_same_adapter_update():
  # SGD, linear in the gradients: Adam's step g / (|g| + eps) on a coordinate whose gradient is at its rounding
  # error would be decided by how each program rounds (tests/train/test_step.py).
  batch = _batch()
  sgd = optax.sgd(0.5)
  results = []
  for remat in (False, True):
    graphdef, params = _adapted_state(CFG.replace(remat=remat))
    adapters = lora.split_adapters(params)[0]
    results.append(_step(graphdef, sgd, nnx.LoRAParam)(params, sgd.init(adapters), batch)[0])
  assert_close_f32(results[1], results[0], ulps=16)  # one step: 16 ulps of each leaf's largest


def _lora_config(num_steps=4):
  c = load_experiment("default")("test")
  c.num_steps = num_steps
  c.model.lora_rank = 4
  c.model.remat = True
  c.grpo.beta = 0.04
  c.optim.learning_rate = 3e-2
  c.checkpoint.every = 2
  c.checkpoint.export_hf = True
  return c


def _params(workdir, config, step=None):
  mesh = sharding_lib.make_mesh()
  settings = Settings.from_config(config)
  tokenizer, _ = build.build_tokenizer_and_task(settings, log=lambda *a, **k: None)
  graphdef, template = build.build_model(settings, tokenizer, mesh)
  params, _ = export_lib.restore_run_params(workdir, template, step)
  return graphdef, params


def shorter_is_better(prompts, completions, **columns):
  """A reward that varies within every group from the first step (the tiny model's sums are all wrong)."""
  return [1.0 / (1 + len(c)) for c in completions]


def test_lora_run_reference_is_the_base_checkpoints_resume_and_export(tmp_path, compile_cache):
  config = _lora_config()
  straight = str(tmp_path / "straight")
  loop.train(config, straight, reward_funcs=[shorter_is_better])
  records = [r for r in read_jsonl(os.path.join(straight, "metrics.jsonl")) if r["step"] > 0]
  # Step 1 samples from the starting policy, which is the base: zero KL to the reference. Later the adapters
  # have moved and the reference (adapters off) has not.
  assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6)
  assert records[-1]["kl"] > 1e-5
  graphdef, final = _params(straight, config)
  _, first = _params(straight, config, step=2)
  adapters_final, base_final = lora.split_adapters(final)
  # The starting point (after the warm start) is saved as a base model, in a full fine-tuning run's layout.
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), base_final)
  base_start, _ = checkpoint_lib.restore_params(RunFiles(straight).warmstart, 0, abstract)
  for x, y in zip(jax.tree.leaves(base_final), jax.tree.leaves(base_start)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(adapters_final),
                                                          jax.tree.leaves(lora.split_adapters(first)[0]))) > 1e-4
  # The checkpoint holds the adapters and their optimizer state alone: neither the frozen base nor a reference
  # copy, so it is the adapters' size; the base's fingerprint in its meta ties it to the saved starting point.
  with open(os.path.join(straight, "checkpoints", "4", "state", "_METADATA")) as f:
    saved = [ast.literal_eval(k) for k in json.load(f)["tree_metadata"]]  # key paths, e.g. ('adapters', ...)
  assert {path[0] for path in saved} == {"adapters", "opt_state"}
  assert all(path[-2] in ("lora_a", "lora_b") for path in saved if path[0] == "adapters"), saved
  with pytest.raises(ValueError, match="not the one they were trained on"):
    checkpoint_lib.restore_lora_base(RunFiles(straight).warmstart, base_final, "0" * 64)

  # Stopped after step 2 and resumed: the same final state, bit for bit.
  resumed = str(tmp_path / "resumed")
  loop.train(_lora_config(num_steps=2), resumed, reward_funcs=[shorter_is_better])
  loop.train(config, resumed, reward_funcs=[shorter_is_better])
  _, final_resumed = _params(resumed, config)
  for x, y in zip(jax.tree.leaves(final_resumed), jax.tree.leaves(final)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

  # The export is the merged model: a plain checkpoint computing what the adapted policy computes.
  exported = hf_io.from_pretrained(RunFiles(straight).hf_model)
  assert not lora.has_adapters(exported)
  policy = nnx.merge(graphdef, final)
  tokens = jnp.asarray(np.arange(12).reshape(2, 6) % 10 + 3, jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((6, 6), bool)), (2, 6, 6))
  np.testing.assert_allclose(np.asarray(exported.logits(exported(tokens, positions, mask)[0])),
                             np.asarray(policy.logits(policy(tokens, positions, mask)[0])), atol=1e-4)


@pytest.mark.parametrize("field,value,match", [
    ("model.lora_targets", "q_proj,attn", "attn"),
    ("model.lora_alpha", 0.0, "lora_alpha"),
    ("model.offload_ref_params", True, "no reference copy"),
    ("grpo.ref_reset_every", 2, "ref_reset_every"),
])
def test_lora_config_errors_name_the_field(field, value, match):
  c = load_experiment("default")("test")
  c.model.lora_rank = 4
  section, key = field.split(".")
  c[section][key] = value
  with pytest.raises(ValueError, match=match):
    checks.validate(c)


def test_the_sampler_gets_the_adapters_in_the_compute_dtype_and_the_base_once():
  """Producer.sync (the weight copy to the sampler's devices, here a mesh of the same one device): each call
  copies the adapters alone, cast to the compute dtype (bfloat16 here, vectors kept); the frozen base is copied at
  the first call only; no implicit transfer (transfer_guard "disallow"); timing/sync_s counts it."""
  config = load_experiment("lora")("test")
  config.model.dtype, config.warmstart.enabled = "bfloat16", False
  run = Run(checks.validate(config), RunInputs(), lambda *_: None)
  model_cfg = nnx.merge(run.policy.graphdef, run.initial_params).cfg
  producer = Producer(run.settings, run.task, run.tokenizer, None, None, run.policy, run.mesh,
                      jax.jit(lambda p: cast_for_compute(p, model_cfg)), (0, 1), bool)
  params = run.initial_params
  moved = jax.tree.map(lambda x: x + 1, params)  # a later policy: adapters and (for this check) base all changed
  with jax.transfer_guard("disallow"):
    producer.sync(params, 0)
    first = producer.params
    producer.sync(moved, 1)
  second = producer.params
  base_first, base_second = run.policy.base_part(first), run.policy.base_part(second)
  assert all(a is b for a, b in zip(jax.tree.leaves(base_first), jax.tree.leaves(base_second)))
  for got, want in zip(jax.tree.leaves(run.policy.trainable_part(second)),
                       jax.tree.leaves(cast_for_compute(run.policy.trainable_part(moved), model_cfg))):
    assert got.dtype == want.dtype == jnp.bfloat16 and np.array_equal(np.asarray(got, np.float32),
                                                                      np.asarray(want, np.float32))
  base = jax.tree.leaves(base_second)
  assert {x.dtype for x in base if x.ndim >= 2} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in base if x.ndim < 2} == {jnp.dtype(jnp.float32)}  # norm scales stay as they are
  assert producer.take_seconds()["timing/sync_s"] > 0 and producer.take_seconds() == {}
