"""Rewards in the worker process (grpo_jax/rewards/isolation.py): where they run, what a timeout costs, and that
a spinning reward bounds a training run."""
from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import pytest

from grpo_jax.rewards import gate_on_format, isolation, make_overlong_reward, score_completions, scoring
from tests.rewards import isolation_rewards as rewards

PROMPTS = ["p"] * 4
COMPLETIONS = ["<think>a</think><answer>1</answer>", "2", "<think>b</think><answer>3</answer>", "x"]
COLUMNS = {"answer": ["1", "2", "4", "x"], "completion_length": [3, 8, 10, 12]}
TIMEOUT = 0.5
# One batch call, then MAX_SAMPLE_TIMEOUTS per-sample calls, each killed after TIMEOUT; a new worker (~0.3 s,
# more on a loaded machine) before each of the later calls.
BOUND_S = (1 + scoring.MAX_SAMPLE_TIMEOUTS) * (TIMEOUT + 1.5)


def _score(fn, isolation_mode="process", timeout_s=TIMEOUT):
  return score_completions([("r", fn, 1.0)], PROMPTS, COMPLETIONS, COLUMNS, timeout_s=timeout_s,
                           isolation=isolation_mode)


@pytest.mark.parametrize("fn", [rewards.pid, "test_isolation_pid"], ids=["module_function", "registered_closure"])
def test_rewards_run_in_the_worker_process(fn):
  res = _score(fn, timeout_s=30.0)
  pids = set(res.per_fn["r"].tolist())
  assert pids == {float(isolation.worker().pid)} and os.getpid() not in pids


def test_thread_isolation_runs_in_this_process():
  assert set(_score(rewards.pid, "thread").per_fn["r"].tolist()) == {float(os.getpid())}


def test_unpicklable_reward_falls_back_to_a_thread(caplog):
  here = os.getpid()
  with caplog.at_level(logging.WARNING):
    res = _score(lambda prompts, completions, **cols: [float(os.getpid())] * len(completions))
  assert set(res.per_fn["r"].tolist()) == {float(here)}
  assert "runs in a thread" in caplog.text


@pytest.mark.parametrize("fn", [rewards.spin, rewards.backtracking_regex], ids=["spins", "holds_the_gil"])
def test_a_reward_that_never_returns_costs_its_timeout_and_leaves_nothing_running(fn):
  # (another test's thread-isolated verifier may still be sleeping out its hang: count only this test's)
  threads, started, abandoned = threading.active_count(), isolation.worker().started, scoring.abandoned_threads()
  start = time.perf_counter()
  with pytest.warns(RuntimeWarning, match="failed on 4 of 4"):
    res = _score(fn)
  elapsed = time.perf_counter() - start
  assert elapsed < BOUND_S, elapsed
  assert res.failures == {"r": 4}
  np.testing.assert_array_equal(res.per_fn["r"], [0, 0, 0, 0])
  # Each timed-out call killed its worker: no thread and no process keeps spinning.
  assert threading.active_count() <= threads and scoring.abandoned_threads() <= abandoned
  assert isolation.worker().started - started >= 1 + scoring.MAX_SAMPLE_TIMEOUTS - 1
  assert isolation.worker().pid is None
  # The next call gets a fresh worker.
  np.testing.assert_array_equal(_score("exact_match").per_fn["r"], [0, 1, 0, 1])


def test_exceptions_and_crashes_are_failures_with_their_cause(caplog):
  with caplog.at_level(logging.WARNING), pytest.warns(RuntimeWarning):
    assert _score(rewards.divide_by_zero).failures == {"r": 4}
  assert "ZeroDivisionError" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING), pytest.warns(RuntimeWarning):
    assert _score(rewards.exit_process).failures == {"r": 4}
  assert "exited with code 3" in caplog.text
  np.testing.assert_array_equal(_score("exact_match").per_fn["r"], [0, 1, 0, 1])


def test_built_reward_objects_run_in_the_worker_with_the_same_scores():
  gated = gate_on_format("gsm8k_accuracy", "format_lenient")
  overlong = make_overlong_reward(max_length=12, buffer=4)
  for fn in (gated, overlong):
    assert isolation.reference(fn) is not None
    np.testing.assert_array_equal(_score(fn).per_fn["r"], _score(fn, "thread").per_fn["r"])
  np.testing.assert_array_equal(_score(gated).per_fn["r"], [1, 0, 0, 0])
  np.testing.assert_array_equal(_score(overlong).per_fn["r"], [0, 0, -0.5, -1])


def test_bad_isolation_is_a_clear_error():
  with pytest.raises(ValueError, match="isolation must be one of"):
    _score("exact_match", "fork")


def test_training_with_a_spinning_reward_is_bounded(tmp_path):
  """Issue 14's bar: 4 steps of the test preset with a reward that spins forever and reward_timeout_s=1 finish
  within 60 s plus 3 s per step (threads used to pile up: 506 s); measured 55 s alone, 79-92 s beside the other
  pytest-xdist worker on a slower 2-core CPU. Here 2 steps (each costs its timeout per call, nothing piles up
  from one to the next) within 60 s plus 3 s per step: far from a pile-up. The timeout is 0.3 s here (each
  spinning call burns a core for it; 16 s alone instead of 23 with 1 s): a pile-up shows in the thread counts."""
  from grpo_jax.train import loop
  from grpo_jax.persist.metrics import read_jsonl
  from tests.train.conftest import load_experiment
  c = load_experiment("default")("test")
  c.num_steps, c.eval.every, c.checkpoint.every = 2, 2, 2
  c.warmstart.enabled = False  # its three evaluations would score the spinning reward too: 14 s more, same code
  c.rewards = {"exact_match": 1.0, "test_isolation_spin": 1.0}
  c.reward_timeout_s = 0.3
  threads, abandoned = threading.active_count(), scoring.abandoned_threads()
  start = time.perf_counter()
  with pytest.warns(RuntimeWarning, match="test_isolation_spin"):
    loop.train(c, str(tmp_path))
  elapsed = time.perf_counter() - start
  assert elapsed < 60 + 3 * c.num_steps, elapsed
  assert threading.active_count() <= threads and scoring.abandoned_threads() <= abandoned
  steps = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "reward" in r]
  assert len(steps) == 2
  batch = c.grpo.prompts_per_step * c.grpo.group_size
  assert [r["rewards/test_isolation_spin/failures"] for r in steps] == [batch] * 2   # counted, as before
