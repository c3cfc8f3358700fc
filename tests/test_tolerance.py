"""tests/tolerance.py's assert_close_f32: it passes within k float32 ulps of the scale and fails beyond."""
import numpy as np
import pytest

from tests.tolerance import EPS32, assert_close_f32


def test_an_element_near_zero_is_judged_at_its_arrays_scale():
  expected = np.array([1.0, 1.6e-9], np.float32)
  # The small element off by 100% of itself but 0.02 ulps of the array's scale: passes (rtol would fail it).
  assert_close_f32(expected + np.array([0, 1.6e-9], np.float32), expected, ulps=1)
  with pytest.raises(AssertionError, match=r"1 of 2 elements .* 4 float32 ulps"):
    assert_close_f32(expected + np.array([0, 5 * EPS32], np.float32), expected, ulps=4)


def test_scale_and_pytrees():
  tree = {"big": np.full(3, 100.0), "small": np.full(3, 1e-3)}
  off = {"big": tree["big"] + 100 * 4 * EPS32, "small": tree["small"] + 100 * 4 * EPS32}
  with pytest.raises(AssertionError, match=r"leaf 1"):  # each leaf has its own scale: 'small' is far off
    assert_close_f32(off, tree, ulps=8)
  assert_close_f32(off, tree, ulps=8, scale=100.0)      # a stated scale: the sum of |terms|, say
  assert_close_f32(np.array([0.5, 2.0]), np.array([0.5, 2.0 + 3 * EPS32]), ulps=4, scale=np.array([0.0, 1.0]))
  with pytest.raises(AssertionError):                     # a per-element scale of 0: exact
    assert_close_f32(np.array([0.5 + EPS32, 2.0]), np.array([0.5, 2.0]), ulps=4, scale=np.array([0.0, 1.0]))


def test_nan_matches_only_nan_and_leaf_counts_must_agree():
  assert_close_f32(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), ulps=1)
  with pytest.raises(AssertionError):
    assert_close_f32(np.array([np.nan, 1.0]), np.array([0.0, 1.0]), ulps=1)
  with pytest.raises(ValueError):
    assert_close_f32([np.ones(2)], [np.ones(2), np.ones(2)], ulps=1)
