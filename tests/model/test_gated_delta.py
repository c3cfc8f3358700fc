"""The gated delta rule's chunked and recurrent forms (grpo_jax/model/gated_delta.py) against a per-token numpy loop
in float64, against each other, and against transformers' torch implementations of Qwen3.5."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.model import gated_delta
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")


def numpy_delta_rule(q, k, v, g, beta, state=None, l2norm=True):
  """The definition, one token at a time in float64: [B, T, H*, D*] inputs, returns (o [B, T, Hv, Dv], state)."""
  q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
  repeat = v.shape[2] // k.shape[2]
  q, k = np.repeat(q, repeat, axis=2), np.repeat(k, repeat, axis=2)
  if l2norm:
    q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (q, k))
  q = q / np.sqrt(q.shape[-1])
  B, T, H, Dk = k.shape
  S = np.zeros((B, H, Dk, v.shape[-1])) if state is None else np.array(state, np.float64)
  o = np.zeros((B, T, H, v.shape[-1]))
  for t in range(T):
    for b in range(B):
      for h in range(H):
        S[b, h] *= np.exp(g[b, t, h])
        delta = beta[b, t, h] * (v[b, t, h] - k[b, t, h] @ S[b, h])
        S[b, h] += np.outer(k[b, t, h], delta)
        o[b, t, h] = q[b, t, h] @ S[b, h]
  return o, S


def inputs(seed, B=2, T=13, Hk=2, Hv=4, Dk=8, Dv=6):
  rng = np.random.default_rng(seed)
  q, k = (rng.normal(size=(B, T, Hk, Dk)).astype(np.float32) for _ in range(2))
  v = rng.normal(size=(B, T, Hv, Dv)).astype(np.float32)
  g = -rng.uniform(0.01, 1.0, size=(B, T, Hv)).astype(np.float32)  # decays between 0.37 and 0.99
  beta = rng.uniform(0.1, 1.0, size=(B, T, Hv)).astype(np.float32)
  return q, k, v, g, beta


@pytest.mark.parametrize("chunk,l2norm", [(1, True), (4, True), (5, False), (64, True)])
def test_both_forms_match_the_per_token_definition(chunk, l2norm):
  """T = 13 tokens: chunks of 4 and 5 leave a partial last chunk; 64 is one chunk; Hv = 2 Hk."""
  q, k, v, g, beta = inputs(0)
  state0 = np.random.default_rng(1).normal(size=(2, 4, 8, 6)).astype(np.float32) * 0.3
  want_o, want_S = numpy_delta_rule(q, k, v, g, beta, state0, l2norm)
  for o, S in (gated_delta.chunked(q, k, v, g, beta, state0, chunk=chunk, l2norm=l2norm),
               gated_delta.recurrent(q, k, v, g, beta, state0, l2norm=l2norm)):
    assert_close_f32(np.asarray(o), want_o, ulps=32)
    assert_close_f32(np.asarray(S), want_S, ulps=32)


def test_a_prefill_state_continues_in_the_recurrent_form():
  """A chunked prefill of 9 tokens, then 4 recurrent steps from its state: the chunked output of all 13."""
  q, k, v, g, beta = inputs(2)
  whole_o, whole_S = gated_delta.chunked(q, k, v, g, beta, chunk=4)
  first = [x[:, :9] for x in (q, k, v, g, beta)]
  rest = [x[:, 9:] for x in (q, k, v, g, beta)]
  _, S = gated_delta.chunked(*first, chunk=4)
  o, S = gated_delta.recurrent(*rest, S)
  assert_close_f32(np.asarray(o), np.asarray(whole_o[:, 9:]), ulps=64)
  assert_close_f32(np.asarray(S), np.asarray(whole_S), ulps=64)


def test_tokens_with_no_decay_and_no_write_leave_the_state_alone():
  """g = 0 and beta = 0 (how a layer keeps left padding out of its state): the state after 3 such tokens and then
  the real ones equals the state of the real ones alone."""
  q, k, v, g, beta = inputs(3, T=8)
  pad = lambda x, value: np.concatenate([np.full((2, 3, *x.shape[2:]), value, np.float32), x], axis=1)
  padded = (pad(q, 0.5), pad(k, 0.7), pad(v, 0.9), pad(g, 0.0), pad(beta, 0.0))
  for form in (lambda *a: gated_delta.chunked(*a, chunk=4), gated_delta.recurrent):
    o, S = form(*padded)
    o_ref, S_ref = form(q, k, v, g, beta)
    assert_close_f32(np.asarray(S), np.asarray(S_ref), ulps=64)
    assert_close_f32(np.asarray(o[:, 3:]), np.asarray(o_ref), ulps=64)


def test_both_forms_match_transformers_qwen3_5():
  import torch
  from transformers.models.qwen3_5 import modeling_qwen3_5 as hf
  q, k, v, g, beta = inputs(4, T=21)
  t = lambda x: torch.tensor(x)
  ref_o, ref_S = hf.torch_chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), chunk_size=8,
                                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
  rec_o, rec_S = hf.torch_recurrent_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
  o, S = gated_delta.chunked(q, k, v, g, beta, chunk=8)
  assert_close_f32(np.asarray(o), ref_o.numpy(), ulps=32)
  assert_close_f32(np.asarray(S), ref_S.numpy(), ulps=32)
  o, S = gated_delta.recurrent(q, k, v, g, beta)
  assert_close_f32(np.asarray(o), rec_o.numpy(), ulps=32)
  assert_close_f32(np.asarray(S), rec_S.numpy(), ulps=32)


def test_gradients_of_the_two_forms_agree():
  """Observed within 2.3 float32 ulps of each gradient's scale (both forms agree with the definition to ~1)."""
  q, k, v, g, beta = (jnp.asarray(x) for x in inputs(5, T=10))
  loss = lambda form: lambda *a: jnp.sum(jnp.sin(form(*a)[0]))
  grads = [jax.grad(loss(f), argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta)
           for f in (lambda *a: gated_delta.chunked(*a, chunk=4), gated_delta.recurrent)]
  for a, b in zip(*grads):
    assert_close_f32(np.asarray(a), np.asarray(b), ulps=32)
