"""Chunked token log-probs and entropies against float64 references (numpy, and transformers' model)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.model import completion_logprobs, hf_io, token_logprobs
from tests.tolerance import assert_close_f32
from .helpers import VOCAB, torch_logits

# Compared with float64 / transformers: full float32 matmuls (TF32 by default on NVIDIA GPUs).
pytestmark = pytest.mark.usefixtures("float32_matmuls")


def _log_softmax64(logits):
  z = logits - logits.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _reference(h, w, y, temperature):
  logp_all = _log_softmax64(np.einsum("btd,dv->btv", h.astype(np.float64), w.astype(np.float64)) / temperature)
  logp = np.take_along_axis(logp_all, y[..., None], -1)[..., 0]
  entropy = -(np.exp(logp_all) * logp_all).sum(-1)
  return logp, entropy


@pytest.fixture(scope="module")
def hwy():
  rng = np.random.default_rng(0)
  B, T, D, V = 2, 7, 8, 11
  return (rng.normal(size=(B, T, D)).astype(np.float32), rng.normal(size=(D, V)).astype(np.float32),
          rng.integers(0, V, size=(B, T)).astype(np.int32))


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 7, 64])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_token_logprobs_matches_full_log_softmax(hwy, chunk_size, with_entropy):
  h, w, y = hwy
  logp, entropy = token_logprobs(h, w, y, temperature=0.7, chunk_size=chunk_size, with_entropy=with_entropy)
  ref_logp, ref_entropy = _reference(h, w, y, 0.7)
  # Against float64: the log-probs within 16 ulps of the largest (0.6 seen, 11 the old atol), the entropies, sums
  # over 11 terms, within 128 (7.4 seen, 83 the old atol).
  assert_close_f32(logp, ref_logp, ulps=16)
  if with_entropy:
    assert_close_f32(entropy, ref_entropy, ulps=128)
  else:
    assert entropy is None


def test_token_logprobs_gradient_matches_unchunked(hwy):
  h, w, y = hwy

  def chunked(h, w):
    logp, ent = token_logprobs(h, w, y, temperature=1.3, chunk_size=3, with_entropy=True)
    return jnp.sum(logp) + 0.5 * jnp.sum(ent)

  def full(h, w):
    logp_all = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w) / 1.3)
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
    return jnp.sum(jnp.take_along_axis(logp_all, y[..., None], -1)) + 0.5 * jnp.sum(ent)

  # Sums over 11 logits and 14 tokens: 2.4 ulps of each gradient's largest seen, 26 the old atol.
  assert_close_f32(jax.grad(chunked, (0, 1))(h, w), jax.grad(full, (0, 1))(h, w), ulps=32)


def _dot_operand_dtypes(fn, *args) -> list[tuple[str, str]]:
  """The operand element types of every dot_general in fn's lowered program."""
  import re
  text = jax.jit(fn).lower(*args).as_text()
  return [tuple(t.split("x")[-1] for t in m.groups()) for m in re.finditer(
      r"dot_general[^\n]*: \(tensor<([^>]*)>, tensor<([^>]*)>\)", text)]


def test_bf16_log_prob_gradient_multiplies_in_bf16_and_matches_float64(hwy):
  """In bfloat16 the LM head's backward products take bf16 operands (autodiff of the float32 logits made both
  of them float32 matmuls), and the gradient of sum(logp) + 0.5 sum(entropy) is the float64 one within bf16
  rounding: dL/dlogits = (onehot(y) - p - 0.5 p (log p + H)) / T, dh = dL/dlogits W^T, dW = h^T dL/dlogits."""
  h, w, y = hwy
  T = 1.3

  def loss(h, w):
    logp, ent = token_logprobs(h, w.astype(jnp.bfloat16), y, temperature=T, chunk_size=3, with_entropy=True)
    return jnp.sum(logp) + 0.5 * jnp.sum(ent)

  hb = jnp.asarray(h, jnp.bfloat16)
  dtypes = _dot_operand_dtypes(jax.grad(loss, (0, 1)), hb, w)
  assert len(dtypes) == 3 and all(d == ("bf16", "bf16") for d in dtypes), dtypes  # forward + two backward
  dh, dw = jax.grad(loss, (0, 1))(hb, w)
  h64, w64 = np.asarray(hb, np.float64), np.asarray(jnp.asarray(w, jnp.bfloat16), np.float64)
  logp_all = _log_softmax64(np.einsum("btd,dv->btv", h64, w64) / T)
  p = np.exp(logp_all)
  entropy = -(p * logp_all).sum(-1, keepdims=True)
  g = (np.eye(w.shape[1])[y] - p + 0.5 * (-p * (logp_all + entropy))) / T  # d loss / d logits
  want_dh, want_dw = np.einsum("btv,dv->btd", g, w64), np.einsum("btd,btv->dv", h64, g)
  for got, want in ((dh, want_dh), (dw, want_dw)):
    got = np.asarray(got, np.float64)
    assert np.max(np.abs(got - want)) <= 0.02 * np.max(np.abs(want)), np.max(np.abs(got - want))


def test_float32_log_probs_keep_the_plain_product(hwy):
  """In float32 the head stays the plain einsum under autodiff (the recorded fingerprints of float32 runs depend
  on it): float32 products, and the unchunked log-softmax's gradient."""
  h, w, y = hwy

  def loss(h, w, plain):
    if plain:
      logits = jnp.einsum("btd,dv->btv", h, w, preferred_element_type=jnp.float32)
      return jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], -1))
    return jnp.sum(token_logprobs(h, w, y, chunk_size=64)[0])

  assert all(d == ("f32", "f32") for d in _dot_operand_dtypes(jax.grad(lambda h, w: loss(h, w, False)), h, w))
  got, want = jax.grad(loss, (0, 1))(h, w, False), jax.grad(loss, (0, 1))(h, w, True)
  assert_close_f32(got, want, ulps=8)  # sums over 11 logits and 14 tokens: 8 ulps of each gradient's largest


@pytest.mark.parametrize("chunk_size", [2, 5, 128])
def test_completion_logprobs_match_transformers_per_row(hf_checkpoints, chunk_size):
  """Left-padded prompts + completions vs each row run alone (unpadded) through transformers, float64."""
  path, torch_model = hf_checkpoints["qwen3_qknorm_untied"]
  model = hf_io.from_pretrained(path)
  rng = np.random.default_rng(1)
  P, N, temperature = 6, 5, 0.8
  prompt_lengths = (6, 4, 2)
  prompt = rng.integers(1, VOCAB, size=(3, P)).astype(np.int32)
  prompt_mask = np.arange(P)[None] >= P - np.array(prompt_lengths)[:, None]
  prompt = np.where(prompt_mask, prompt, 0)
  completion = rng.integers(1, VOCAB, size=(3, N)).astype(np.int32)
  completion_mask = np.arange(N)[None] < np.array([5, 3, 1])[:, None]
  logp, entropy = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask,
                                      temperature=temperature, chunk_size=chunk_size, with_entropy=True)
  logp, entropy = np.asarray(logp), np.asarray(entropy)
  for b, n in enumerate(prompt_lengths):
    seq = np.concatenate([prompt[b, P - n:], completion[b]])[None]
    logits = torch_logits(torch_model, seq, np.ones_like(seq, bool))[0]
    logp_all = _log_softmax64(logits[n - 1:n - 1 + N] / temperature)
    ref = logp_all[np.arange(N), completion[b]]
    ref_entropy = -(np.exp(logp_all) * logp_all).sum(-1)
    m = completion_mask[b]
    np.testing.assert_allclose(logp[b][m], ref[m], atol=1e-4, rtol=0)
    np.testing.assert_allclose(entropy[b][m], ref_entropy[m], atol=1e-4, rtol=0)
