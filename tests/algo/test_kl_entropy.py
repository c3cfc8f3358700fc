import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algo import kl
from grpo_jax.algo.entropy import entropy_from_logits, top_entropy_mask
from tests.tolerance import assert_close_f32
from . import reference as ref


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_match_reference(name):
  rng = np.random.default_rng(0)
  logp = -rng.exponential(2.0, size=200).astype(np.float32)
  ref_logp = (logp + rng.normal(0, 1.0, size=200)).astype(np.float32)
  ref_logp[:5] = logp[:5]                                      # π_θ = π_ref: every estimator is 0
  got = kl.get_kl_estimator(name)(jnp.asarray(logp), jnp.asarray(ref_logp))
  assert_close_f32(got, ref.kl(name, logp, ref_logp), ulps=8)  # an exp and two subtractions: 0.9 ulps seen
  assert np.all(np.asarray(got[:5]) == 0.0)


def test_k3_is_nonnegative_and_precise_near_zero():
  d = np.array([-1e-4, -1e-6, 1e-6, 1e-4, -0.099, 0.101, 0.5, 3.0, -3.0], np.float32)
  got = np.asarray(kl.k3(jnp.zeros_like(d), jnp.asarray(d)))
  assert np.all(got >= 0)
  np.testing.assert_allclose(got, ref.kl("k3", np.zeros(9), np.float64(d)), rtol=1e-5)


def test_kl_gradients():
  # ∂k1/∂logp = 1, ∂k2/∂logp = −d = logp − ref, ∂k3/∂logp = 1 − π_ref/π_θ.
  logp, r = jnp.array([-1.0, -2.0, -0.5]), jnp.array([-1.5, -1.0, -0.5])
  g = lambda f: jax.grad(lambda x: jnp.sum(f(x, r)))(logp)
  np.testing.assert_allclose(g(kl.k1), 1.0)
  np.testing.assert_allclose(g(kl.k2), logp - r, rtol=1e-6)
  # One float32 exp of up to e: 0.4 ulps of the largest seen; 8, the old rtol at it.
  assert_close_f32(g(kl.k3), 1 - np.exp(np.float64(r - logp)), ulps=8)


def test_unknown_kl_estimator():
  with pytest.raises(ValueError, match="unknown KL estimator 'k4'.*'k1', 'k2', 'k3'"):
    kl.get_kl_estimator("k4")


def test_entropy_from_logits_matches_reference():
  rng = np.random.default_rng(1)
  logits = (rng.normal(size=(3, 4, 11)) * 3).astype(np.float32)
  logits[0, 0] = [50.0] + [-50.0] * 10                         # near-deterministic: entropy ≈ 0
  logits[0, 1] = 0.0                                           # uniform: log V
  got = entropy_from_logits(jnp.asarray(logits))
  assert got.shape == (3, 4)
  assert_close_f32(got, ref.entropy(logits), ulps=32)  # a log-softmax and a sum over 11 logits: 4.9 ulps seen
  np.testing.assert_allclose(got[0, 1], np.log(11), rtol=1e-6)


@pytest.mark.parametrize("q", [0.2, 0.5, 1.0])
def test_top_entropy_mask_matches_reference(q):
  rng = np.random.default_rng(2)
  ent = rng.exponential(size=(5, 7)).astype(np.float32)
  lengths = [0, 1, 7, 3, 5]
  mask = np.arange(7)[None] < np.array(lengths)[:, None]
  ent[~mask] = 100.0                                            # padding must not enter the quantile
  got = np.asarray(top_entropy_mask(jnp.asarray(ent), jnp.asarray(mask), q))
  expected = ref.top_entropy_select(ent, lengths, q)
  for i, n in enumerate(lengths):
    np.testing.assert_array_equal(got[i, :n], expected[i])
    assert not got[i, n:].any()
  kept = got.sum() / mask.sum()
  assert kept >= q - 1e-6 and kept <= q + 1.0 / mask.sum() + 1e-6


def test_top_entropy_mask_all_empty_and_bad_quantile():
  assert not np.asarray(top_entropy_mask(jnp.ones((2, 3)), jnp.zeros((2, 3), bool), 0.2)).any()
  with pytest.raises(ValueError, match=r"top_entropy_quantile must be in \(0, 1\]"):
    top_entropy_mask(jnp.ones((2, 3)), jnp.ones((2, 3), bool), 0.0)
