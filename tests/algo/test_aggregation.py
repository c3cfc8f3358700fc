import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algo import aggregation as agg
from . import reference as ref
from .batches import make_batch

MODES = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("C_max", [None, 16])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_reference_with_nan_padding(mode, C_max, seed):
  b = make_batch(seed)                  # lengths include 0, 1 and T; padding is NaN
  loss = b["logp"]
  total, denom = agg.aggregate(mode, jnp.asarray(loss), jnp.asarray(b["mask"]), C_max)
  expected = ref.aggregate([np.float64(loss[i, :n]) for i, n in enumerate(b["lengths"])], mode, C_max or 6)
  assert np.isfinite(float(total)) and np.isfinite(float(denom))
  np.testing.assert_allclose(float(agg.safe_divide(total, denom)), expected, rtol=1e-5)


def test_denominators():
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
  loss = jnp.ones((3, 4))
  assert [float(x) for x in agg.seq_mean_token_mean(loss, mask)] == [2.0, 2.0]     # two non-empty rows
  assert [float(x) for x in agg.token_mean(loss, mask)] == [4.0, 4.0]
  assert [float(x) for x in agg.seq_mean_token_sum_norm(loss, mask)] == [4.0, 8.0]  # 2 rows × T=4
  assert [float(x) for x in agg.seq_mean_token_sum_norm(loss, mask, 10)] == [4.0, 20.0]


@pytest.mark.parametrize("mode", MODES)
def test_all_empty_gives_zero_not_nan(mode):
  total, denom = agg.aggregate(mode, jnp.full((2, 3), jnp.nan), jnp.zeros((2, 3), bool))
  assert float(total) == 0.0 and float(denom) == 0.0
  assert float(agg.safe_divide(total, denom)) == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_pieces_add_up_to_the_whole(mode):
  b = make_batch(3)
  loss, mask = jnp.asarray(b["logp"]), jnp.asarray(b["mask"])
  whole = agg.aggregate(mode, loss, mask)
  parts = [agg.aggregate(mode, loss[k:k + 2], mask[k:k + 2], 6) for k in range(0, 8, 2)]
  np.testing.assert_allclose(sum(p[0] for p in parts), whole[0], rtol=1e-6)
  np.testing.assert_allclose(sum(p[1] for p in parts), whole[1], rtol=1e-6)


def test_masked_sum_count_and_unknown_mode():
  s, c = agg.masked_sum_count(jnp.array([[2.0, jnp.nan], [4.0, 6.0]]), jnp.array([[1, 0], [1, 1]]))
  assert (float(s), float(c)) == (12.0, 3.0)
  with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
    agg.aggregate("mean", jnp.ones((1, 1)), jnp.ones((1, 1)))
