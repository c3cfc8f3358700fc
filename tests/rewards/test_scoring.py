import threading
import time
import warnings

import numpy as np
import pytest

from grpo_jax.rewards import RewardResult, score_completions
from grpo_jax.rewards import scoring

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["1", "2", "x", "4"]
COLUMNS = {"answer": ["1", "5", "x", "4"]}


def length_reward(prompts, completions, **cols):
  return [float(len(c)) for c in completions]


def test_weighted_total_against_hand_sum():
  res = score_completions([("em", "exact_match", 2.0), ("len", length_reward, -0.5)], PROMPTS,
                          ["1", "2", "xy", "4"], COLUMNS, timeout_s=1.0)
  assert isinstance(res, RewardResult)
  np.testing.assert_array_equal(res.per_fn["em"], [1, 0, 0, 1])
  np.testing.assert_array_equal(res.per_fn["len"], [1, 1, 2, 1])
  np.testing.assert_allclose(res.total, [2 - 0.5, -0.5, -1.0, 2 - 0.5])
  assert res.total.dtype == np.float32 and res.failures == {"em": 0, "len": 0}


def test_raising_fn_isolated_per_sample():
  def picky(prompts, completions, answer, **cols):
    # Raises for the whole batch because of sample 2; per-sample retry keeps the others' scores.
    return [1 / 0 if c == "x" else float(c == a) for c, a in zip(completions, answer)]

  with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)  # one failed sample of four must not warn
    res = score_completions([("picky", picky, 1.0)], PROMPTS, COMPLETIONS, COLUMNS, timeout_s=1.0,
                            fallback=-1.0)
  np.testing.assert_array_equal(res.per_fn["picky"], [1, 0, -1, 1])
  assert res.failures == {"picky": 1}
  assert res.not_applicable == {"picky": 0}


def test_always_raising_fn_warns_loudly_and_run_goes_on():
  def broken(prompts, completions, **cols):
    raise KeyError("no such column")

  with pytest.warns(RuntimeWarning, match="'broken' failed on 4 of 4"):
    res = score_completions([("broken", broken, 1.0), ("em", "exact_match", 1.0)], PROMPTS, COMPLETIONS,
                            COLUMNS, timeout_s=1.0, fallback=0.25)
  np.testing.assert_array_equal(res.per_fn["broken"], [0.25] * 4)
  np.testing.assert_allclose(res.total, np.array([1, 0, 1, 1]) + 0.25)
  assert res.failures == {"broken": 4, "em": 0}


def test_sleeping_fn_times_out_without_hanging():
  release = threading.Event()

  def sleepy(prompts, completions, **cols):
    release.wait(30)  # far past the timeout; released at the end so no thread outlives the test for long
    return [1.0] * len(completions)

  start = time.perf_counter()
  try:
    with pytest.warns(RuntimeWarning, match="sleepy"):
      res = score_completions([("sleepy", sleepy, 1.0), ("em", "exact_match", 1.0)], PROMPTS, COMPLETIONS,
                              COLUMNS, timeout_s=0.2)
    # The batch call and MAX_SAMPLE_TIMEOUTS per-sample calls were abandoned and are still waiting.
    sleeping = [t for t in threading.enumerate() if t.name == "reward:sleepy"]
    assert len(sleeping) == 1 + scoring.MAX_SAMPLE_TIMEOUTS
    assert scoring.abandoned_threads() >= len(sleeping)
  finally:
    release.set()
  elapsed = time.perf_counter() - start
  # One batch call plus MAX_SAMPLE_TIMEOUTS per-sample calls, each 0.2 s; the rest are skipped. (The bound is
  # loose for a loaded machine; without the timeout this would take 30 s.)
  assert elapsed < 0.2 * (1 + scoring.MAX_SAMPLE_TIMEOUTS) + 2.0, elapsed
  assert res.failures == {"sleepy": 4, "em": 0}
  np.testing.assert_array_equal(res.per_fn["sleepy"], [0, 0, 0, 0])
  np.testing.assert_array_equal(res.total, [1, 0, 1, 1])
  for thread in sleeping:
    thread.join(5)
  assert not any(t.is_alive() for t in sleeping)


def test_one_slow_sample_only_costs_itself():
  def slow_on_x(prompts, completions, **cols):
    if "x" in completions:
      time.sleep(1.0)
    return [2.0] * len(completions)

  res = score_completions([("slow", slow_on_x, 1.0)], PROMPTS, COMPLETIONS, timeout_s=0.3)
  np.testing.assert_array_equal(res.per_fn["slow"], [2, 2, 0, 2])
  assert res.failures == {"slow": 1}


def test_none_is_not_applicable_and_bad_values_are_failures():
  def partial(prompts, completions, **cols):
    return [None, 1.0, float("nan"), "high"]

  res = score_completions([("partial", partial, 1.0)], PROMPTS, COMPLETIONS, timeout_s=1.0, fallback=0.5)
  np.testing.assert_array_equal(res.per_fn["partial"], [0.5, 1.0, 0.5, 0.5])
  assert res.not_applicable == {"partial": 1}
  assert res.failures == {"partial": 2}


def test_wrong_length_result_is_a_failure_not_a_crash():
  res = score_completions([("short", lambda p, c, **k: [1.0], 1.0)], PROMPTS, COMPLETIONS, timeout_s=1.0)
  # Per-sample retry gets a 1-element list per call, which is the right length there.
  np.testing.assert_array_equal(res.per_fn["short"], [1, 1, 1, 1])
  assert res.failures == {"short": 0}


def test_no_timeout_runs_on_the_calling_thread():
  seen = []

  def where(prompts, completions, **cols):
    seen.append(threading.current_thread())
    return [0.0] * len(completions)

  score_completions([("where", where, 1.0)], PROMPTS, COMPLETIONS, timeout_s=None)
  assert seen == [threading.current_thread()]


def test_bad_arguments_are_clear_errors():
  with pytest.raises(ValueError, match="3 prompts for 4 completions"):
    score_completions([("em", "exact_match", 1.0)], PROMPTS[:3], COMPLETIONS, COLUMNS)
  with pytest.raises(ValueError, match="column 'answer' has 2 entries for 4"):
    score_completions([("em", "exact_match", 1.0)], PROMPTS, COMPLETIONS, {"answer": [1, 2]})
  with pytest.raises(ValueError, match="unique"):
    score_completions([("em", "exact_match", 1.0)] * 2, PROMPTS, COMPLETIONS, COLUMNS)
  with pytest.raises(ValueError, match="'em': weight must be a finite number"):
    score_completions([("em", "exact_match", "1")], PROMPTS, COMPLETIONS, COLUMNS)
  with pytest.raises(ValueError, match="unknown reward"):
    score_completions([("em", "exact_mtch", 1.0)], PROMPTS, COMPLETIONS, COLUMNS)
