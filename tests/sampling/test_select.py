"""Token selection primitives against float64 numpy references."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.sampling import SamplingConfig, bucket_size
from grpo_jax.sampling.buckets import left_pad
from grpo_jax.sampling.select import first_argmax, kth_largest, nucleus_threshold, sample_inverse_cdf


def rows_with_ties_and_scales():
  x = np.random.default_rng(0).normal(size=(6, 300)).astype(np.float32)
  x *= np.array([1e-3, 1.0, 30.0, 1e4, 1.0, 1.0], np.float32)[:, None]
  x[4, 10:20] = 2.5   # ties at the top
  x[5] = -np.abs(x[5]) - 1.0  # all negative
  return x


def test_kth_largest_equals_sorting():
  x = rows_with_ties_and_scales()
  f = jax.jit(kth_largest)  # k traced: one compilation for all k
  for k in (1, 2, 7, 15, 299, 300):
    np.testing.assert_array_equal(np.asarray(f(x, k)), -np.sort(-x, axis=1)[:, k - 1])


def test_first_argmax_takes_first_of_ties():
  x = rows_with_ties_and_scales()
  np.testing.assert_array_equal(np.asarray(first_argmax(jnp.asarray(x))), np.argmax(x, axis=1))


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_nucleus_threshold_keeps_the_sorted_prefix(top_p):
  z = np.random.default_rng(1).normal(size=(5, 400)) * np.array([0.1, 1.0, 3.0, 8.0, 1.0])[:, None]
  w = np.exp(z - z.max(1, keepdims=True)).astype(np.float32)
  w[4, 100:] = 0.0  # zero weights (a top-k cut) never enter
  tau = np.asarray(jax.jit(nucleus_threshold, static_argnums=1)(w, top_p))
  for b in range(len(w)):
    q = w[b].astype(np.float64) / w[b].sum()
    srt = -np.sort(-q)
    mass_before = np.cumsum(srt) - srt
    kept = np.sum(mass_before < top_p)
    got = np.sum(w[b] >= tau[b])
    # Exact up to float32 rounding of the mass: only tokens whose mass_before is within 1e-5 of top_p move.
    ambiguous = np.sum(np.abs(mass_before - top_p) < 1e-5)
    assert abs(got - kept) <= ambiguous, (b, got, kept)
    assert got >= 1


def test_sample_inverse_cdf_frequencies_and_support():
  w = np.array([[0.0, 3.0, 0.0, 1.0, 0.0, 4.0, 0.0],
                [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.5]], np.float32)
  n = 20000
  keys = jax.random.split(jax.random.key(0), n)
  u = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(keys)
  draws = np.asarray(jax.jit(jax.vmap(lambda u: sample_inverse_cdf(u, jnp.asarray(w))))(u))
  assert set(np.unique(draws[:, 1])) == {6}
  freq = np.bincount(draws[:, 0], minlength=7) / n
  np.testing.assert_array_equal(freq[[0, 2, 4, 6]], 0.0)
  # 4 standard errors of a binomial proportion at n=20000 is < 0.015.
  np.testing.assert_allclose(freq[[1, 3, 5]], [3 / 8, 1 / 8, 4 / 8], atol=0.015)


@pytest.mark.parametrize("V", [7, 1000, 4096])
def test_sample_inverse_cdf_equals_flat_inverse_cdf(V):
  """The two-level search picks the token a float64 search over the whole cumulative sum picks."""
  rng = np.random.default_rng(V)
  B = 64
  w = rng.exponential(size=(B, V)).astype(np.float32)
  w[rng.random((B, V)) < 0.5] = 0.0          # zero-weight tokens scattered everywhere
  w[np.arange(B), rng.integers(0, V, B)] = 1.0  # but at least one positive weight per row
  w[0] = 0.0
  w[0, V - 1] = 2.0                          # only the last token (in the padded last block) is allowed
  w[1] = 0.0
  w[1, 0] = 1.0                              # only the first token
  u = rng.random(B).astype(np.float32)
  u[2:6] = [0.0, np.nextafter(np.float32(1), np.float32(0)), 0.5, 1e-7]
  got = np.asarray(jax.jit(sample_inverse_cdf)(jnp.asarray(u), jnp.asarray(w)))
  cdf = np.cumsum(w.astype(np.float64), axis=1)
  target = u.astype(np.float64) * cdf[:, -1]
  want = np.array([np.searchsorted(cdf[b], target[b], side="right") for b in range(B)])
  want = np.minimum(want, V - 1)
  assert np.all(w[np.arange(B), got] > 0), "a zero-weight token was drawn"
  # Float32 sums may move a target that lies within rounding of a boundary to the neighbouring token.
  near = np.array([np.min(np.abs(cdf[b] - target[b])) for b in range(B)]) < 1e-5 * cdf[:, -1]
  assert np.all((got == want) | near), np.nonzero((got != want) & ~near)
  assert np.sum(got == want) >= B - 2
  assert got[0] == V - 1 and got[1] == 0


def test_bucket_size():
  assert [bucket_size(n, 16, 128) for n in (1, 16, 17, 24, 25, 33, 49, 100, 128, 129, 300)] == [
      16, 16, 24, 24, 32, 48, 64, 128, 128, 256, 384]
  assert [bucket_size(n, 1, 64) for n in (1, 2, 3, 5, 7, 9, 13, 64, 65, 200)] == [1, 2, 4, 6, 8, 12, 16, 64, 128, 256]
  assert bucket_size(40, 40, 40) == 40 and bucket_size(7, 40, 40) == 40  # the trainer's fixed prompt length
  with pytest.raises(ValueError, match="n=0"):
    bucket_size(0)


def test_left_pad_adds_dummy_rows():
  tokens, mask = left_pad([[5, 6, 7], [8]], length=4, rows=3, pad_id=1)
  np.testing.assert_array_equal(tokens, [[1, 5, 6, 7], [1, 1, 1, 8], [1, 1, 1, 1]])
  np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1]])


@pytest.mark.parametrize("kw,msg", [
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(max_new_tokens=4, temperature=0.0), "temperature=0.0"),
    (dict(max_new_tokens=4, top_k=-1), "top_k=-1"),
    (dict(max_new_tokens=4, top_p=0.0), "top_p=0.0"),
    (dict(max_new_tokens=4, top_p=1.5), "top_p=1.5"),
    (dict(max_new_tokens=4, stop_ids=[3, -1]), "stop_ids"),
])
def test_sampling_config_rejects_bad_values(kw, msg):
  with pytest.raises(ValueError, match=msg):
    SamplingConfig(**kw)


def test_sampling_config_stores_stop_ids_as_hashable_tuple():
  cfg = SamplingConfig(max_new_tokens=4, stop_ids=[3, 9])
  assert cfg.stop_ids == (3, 9) and hash(cfg) == hash(SamplingConfig(max_new_tokens=4, stop_ids=(3, 9)))
