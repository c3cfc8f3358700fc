import logging

import numpy as np
import pytest

from grpo_jax.rewards import make_math_accuracy, make_overlong_reward, score_completions, soft_overlong_penalty
from grpo_jax.rewards import math_answer


def test_soft_overlong_penalty_matches_dapo_piecewise_formula():
  max_len, buffer, factor = 20, 8, 0.5
  lengths = np.arange(0, 26)
  expected = [0.0 if L <= max_len - buffer else (max_len - buffer - L) / buffer * factor if L <= max_len
              else -factor for L in lengths]
  np.testing.assert_allclose(soft_overlong_penalty(lengths, max_len, buffer, factor), expected, rtol=1e-6)
  assert soft_overlong_penalty([16], 20, 8)[0] == pytest.approx(-0.5)
  with pytest.raises(ValueError, match="buffer"):
    soft_overlong_penalty([1], 10, 0)
  with pytest.raises(ValueError, match="buffer"):
    make_overlong_reward(10, 11)


def test_overlong_reward_in_scoring_uses_length_column():
  fn = make_overlong_reward(max_length=10, buffer=4)
  res = score_completions([("em", "exact_match", 1.0), ("overlong", fn, 1.0)], ["p"] * 3, ["a", "b", "c"],
                          {"answer": ["a", "a", "a"], "completion_length": [3, 8, 10]}, timeout_s=1.0)
  np.testing.assert_allclose(res.total, [1.0, -0.5, -1.0])
  with pytest.raises(KeyError, match="completion_length"):
    fn(["p"], ["a"], answer=["a"])


def test_math_verify_backend_when_installed():
  pytest.importorskip("math_verify")
  fn = make_math_accuracy("math_verify")
  completions = ["\\boxed{\\sqrt{8}}", "\\boxed{(x+1)^2}", "\\boxed{3}", "\\boxed{\\frac{1}{2}}"]
  golds = ["2\\sqrt{2}", "x^2 + 2x + 1", "4", "0.5"]
  assert fn([""] * 4, completions, answer=golds) == [1.0, 1.0, 0.0, 1.0]
  assert make_math_accuracy("builtin")([""] * 4, completions, answer=golds) == [0.0, 0.0, 0.0, 1.0]
  # In the scorer's worker threads math-verify's signal-based timeouts must be off, else it would fail.
  res = score_completions([("mv", fn, 1.0)], [""] * 4, completions, {"answer": golds}, timeout_s=30.0)
  assert res.failures == {"mv": 0}
  np.testing.assert_array_equal(res.per_fn["mv"], [1, 1, 0, 1])


def test_math_verify_missing_falls_back_with_message(monkeypatch, caplog):
  monkeypatch.setattr(math_answer, "_math_verify_module", lambda: None)
  fn = make_math_accuracy("math_verify")
  assert fn(["", ""], ["\\boxed{\\sqrt{8}}", "\\boxed{0.5}"], answer=["2\\sqrt{2}", "\\frac12"]) == [0.0, 1.0]
  monkeypatch.undo()
  import builtins
  real_import = builtins.__import__

  def no_math_verify(name, *args, **kwargs):
    if name == "math_verify":
      raise ImportError("No module named 'math_verify'")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_math_verify)
  monkeypatch.setattr(math_answer._math_verify_module, "warned", False, raising=False)
  with caplog.at_level(logging.WARNING):
    assert math_answer.math_verify_equal("1", "1") is None
  assert "pip install 'grpo_jax[math]'" in caplog.text


def test_unknown_backend():
  with pytest.raises(ValueError, match="unknown math backend"):
    make_math_accuracy("sympy")
