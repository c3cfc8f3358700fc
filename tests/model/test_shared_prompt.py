"""The shared-prompt forward (`completion_logprobs(..., prompt_repeats=s)`): each prompt runs once for its s
rows. Log-probs, entropies and gradients equal the per-row forward's; the compiled program does fewer FLOPs.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import ModelConfig, Transformer, completion_logprobs
from grpo_jax.model.config import FULL, LINEAR
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=8, attention_bias=True, qk_norm=True, max_position_embeddings=256)
# Qwen3.5's hybrid: the prompt's pass hands the completions its linear layers' recurrent state and convolution window.
HYBRID = dataclasses.replace(CFG, family="qwen3_5_text", attention_bias=False, attention_output_gate=True,
                             partial_rotary_factor=0.5, layer_types=(LINEAR, FULL, LINEAR), linear_num_key_heads=2,
                             linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=4)


def _grouped_batch(R=3, G=4, P=7, C=9, seed=0):
  """R prompts of different real lengths (left padded), each repeated G times, and B = R·G completions with
  stop masks of varying lengths. Returns (prompt, prompt_mask, completion, completion_mask, weights)."""
  rng = np.random.default_rng(seed)
  lengths_R = np.array([P, 4, 1, 6, 3][:R])
  prompt_mask_RxP = (np.arange(P)[None] >= P - lengths_R[:, None]).astype(np.int32)
  prompt_RxP = np.where(prompt_mask_RxP > 0, rng.integers(1, CFG.vocab_size, (R, P)), 0).astype(np.int32)
  B = R * G
  completion_mask = (np.arange(C)[None] < rng.integers(1, C + 1, B)[:, None]).astype(np.int32)
  return (np.repeat(prompt_RxP, G, 0), np.repeat(prompt_mask_RxP, G, 0),
          rng.integers(0, CFG.vocab_size, (B, C)).astype(np.int32), completion_mask,
          rng.normal(size=(B, C)).astype(np.float32))


def _loss_fn(cfg, repeats):
  """value_and_grad of a weighted sum of log-probs and entropies, through merged parameters as in the update."""
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

  def loss(p, prompt, prompt_mask, completion, completion_mask, weights):
    logp, entropy = completion_logprobs(nnx.merge(graphdef, p), prompt, prompt_mask, completion, completion_mask,
                                        0.9, 4, True, prompt_repeats=repeats)
    real = completion_mask > 0
    return jnp.sum(jnp.where(real, logp * weights + 0.1 * entropy, 0.0)), (logp, entropy)

  return jax.jit(jax.value_and_grad(loss, has_aux=True)), params


# Every variant at repeats 4; at repeats 2 the einsum path (`-m slow` adds remat and jax attention there: they pass).
@pytest.mark.parametrize("repeats,variant", [(2, "einsum"), (4, "einsum"), (4, "remat"), (4, "jax_attention"),
                                             (4, "linear_attention"), pytest.param(2, "remat", marks=pytest.mark.slow),
                                             pytest.param(2, "jax_attention", marks=pytest.mark.slow)])
def test_shared_prompt_forward_matches_per_row(repeats, variant):
  cfg = {"einsum": CFG, "remat": dataclasses.replace(CFG, remat=True),
         "jax_attention": dataclasses.replace(CFG, attention="jax"), "linear_attention": HYBRID}[variant]
  batch = _grouped_batch(G=4)
  per_row, params = _loss_fn(cfg, 1)
  shared, _ = _loss_fn(cfg, repeats)
  (loss, (logp, ent)), grads = per_row(params, *batch)
  (loss_s, (logp_s, ent_s)), grads_s = shared(params, *batch)
  real = batch[3] > 0
  # The log-probs and entropies within 64 ulps of their largest (1.8 seen; the old atol 2e-5 is ~40).
  assert_close_f32(np.asarray(logp_s)[real], np.asarray(logp)[real], ulps=64)
  assert_close_f32(np.asarray(ent_s)[real], np.asarray(ent)[real], ulps=64)
  np.testing.assert_allclose(loss_s, loss, rtol=1e-5)
  flat, flat_s = jax.tree.leaves(grads), jax.tree.leaves(grads_s)
  assert len(flat) == len(flat_s) and all(float(jnp.abs(g).max()) > 0 for g in flat)
  # Each leaf's gradient sums over every token of every row: 32 ulps of its largest element (seen: 6). The linear
  # layers' decay parameters (A_log, dt_bias) sum, over every token, products through cumulative decays that the two
  # forms chunk at different tokens (7 + 9 against 16): 192 ulps of their largest element (seen: 130; the others 10).
  assert_close_f32(grads_s, grads, ulps=192 if variant == "linear_attention" else 32)


def test_rows_that_do_not_share_their_prompt_give_different_results():
  """The shared path really reads each run's first prompt: rows whose prompts differ within a run disagree."""
  prompt, prompt_mask, completion, completion_mask, weights = _grouped_batch(G=4)
  prompt = prompt.copy()
  prompt[1, -1] = (prompt[1, -1] + 1) % CFG.vocab_size       # row 1's prompt differs from row 0's
  per_row, params = _loss_fn(CFG, 1)
  shared, _ = _loss_fn(CFG, 4)
  logp = np.asarray(per_row(params, prompt, prompt_mask, completion, completion_mask, weights)[0][1][0])
  logp_s = np.asarray(shared(params, prompt, prompt_mask, completion, completion_mask, weights)[0][1][0])
  assert np.abs(logp_s[1] - logp[1]).max() > 1e-3
  assert_close_f32(logp_s[2:], logp[2:], ulps=64)  # 0.9 ulps of the largest seen, 37 the old atol


def test_rows_not_in_whole_runs_are_an_error():
  batch = _grouped_batch(R=3, G=2)
  model = Transformer(CFG, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="prompt_repeats=4"):
    completion_logprobs(model, *batch[:4], prompt_repeats=4)


def test_shared_prompt_forward_does_fewer_flops():
  """XLA's FLOP count of the compiled gradient: a group of 8 rows with a 48-token prompt and 16-token
  completions runs 48 + 8·16 = 176 positions instead of 8·64 = 512 (about 0.34x; attention adds a little)."""
  cfg = dataclasses.replace(CFG, num_layers=2)
  batch = _grouped_batch(R=2, G=8, P=48, C=16)

  def flops(repeats):
    fn, params = _loss_fn(cfg, repeats)
    return fn.lower(params, *batch).compile().cost_analysis()["flops"]

  per_row, shared = flops(1), flops(8)
  print(f"gradient FLOPs: per row {per_row:.3e}, shared prompt {shared:.3e} ({shared / per_row:.2f}x)")
  assert shared < 0.5 * per_row
