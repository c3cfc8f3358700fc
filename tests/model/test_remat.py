"""Rematerialized decoder layers (`ModelConfig.remat`): the same gradients, less memory for activations.

The update differentiates through `nnx.merge`d parameters inside `jax.value_and_grad`; remat there once raised
"Cannot mutate Param from a different trace level", so the gradient is taken the way `train/step.py` takes it.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import ModelConfig, Transformer, completion_logprobs
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=8, attention_bias=True, max_position_embeddings=256)


def _loss_and_grad(cfg, params_cfg, batch):
  """((loss, the sum of its terms' magnitudes), grads) of a per-token-weighted log-prob sum, through merged
  parameters as in the update."""
  graphdef, params = nnx.split(Transformer(params_cfg, rngs=nnx.Rngs(0)))
  graphdef = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))[0] if cfg != params_cfg else graphdef

  def loss(p, prompt, prompt_mask, completion, completion_mask, weights):
    model = nnx.merge(graphdef, p)
    logp, _ = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask, 1.0, 16, False)
    return jnp.sum(logp * weights), jnp.sum(jnp.abs(logp * weights))

  return jax.jit(jax.value_and_grad(loss, has_aux=True)), params


def _batch(B=4, P=6, N=10, seed=0):
  rng = np.random.default_rng(seed)
  prompt_mask = np.ones((B, P), np.int32)
  prompt_mask[1, :2] = 0                                         # left padding
  completion_mask = (np.arange(N)[None] < rng.integers(1, N + 1, B)[:, None]).astype(np.int32)
  return (jnp.asarray(rng.integers(0, CFG.vocab_size, (B, P)), jnp.int32), jnp.asarray(prompt_mask),
          jnp.asarray(rng.integers(0, CFG.vocab_size, (B, N)), jnp.int32), jnp.asarray(completion_mask),
          jnp.asarray(rng.normal(size=(B, N)), jnp.float32))


def test_gradients_with_and_without_remat_agree():
  batch = _batch()
  plain_fn, params = _loss_and_grad(CFG, CFG, batch)
  remat_fn, _ = _loss_and_grad(dataclasses.replace(CFG, remat=True), CFG, batch)
  (loss, terms), grads = plain_fn(params, *batch)
  (loss_r, _), grads_r = remat_fn(params, *batch)
  # The recomputed forward may round differently: the loss within 16 ulps of its terms' magnitudes, each
  # gradient leaf (a sum over every token) within 32 ulps of its largest element.
  assert_close_f32(loss_r, loss, ulps=16, scale=terms)
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
  assert_close_f32(grads_r, grads, ulps=32)


def _saved_residual_bytes(remat: bool) -> int:
  """Bytes the backward pass keeps from the forward pass (jax's own accounting, before XLA)."""
  cfg = dataclasses.replace(CFG, num_layers=4, remat=remat)
  batch = _batch(B=4, P=16, N=48)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

  def loss(p, prompt, prompt_mask, completion, completion_mask, weights):
    logp, _ = completion_logprobs(nnx.merge(graphdef, p), prompt, prompt_mask, completion, completion_mask, 1.0,
                                  16, False)
    return jnp.sum(logp * weights)

  # jax.vjp's backward function is a pytree whose leaves are the residuals it keeps.
  _, backward = jax.vjp(lambda p: loss(p, *batch), params)
  return sum(x.nbytes for x in jax.tree.leaves(backward))


def test_remat_saves_only_layer_inputs_for_the_backward_pass():
  without, with_remat = _saved_residual_bytes(False), _saved_residual_bytes(True)
  # Without remat: per layer the attention probabilities [B, heads, T, T], q/k/v, the MLP's [B, T, F] terms...
  # With it: per layer its input [B, T, D] (plus the parameters and the log-prob chunks, as before).
  assert with_remat < 0.5 * without, (with_remat, without)
