"""Scoring completions with several weighted reward functions, never letting one of them stop the run.

Execution model (a deliberate trade-off):
- Each reward function is first called once on the whole batch, with a timeout of `timeout_s` seconds:
  in the reward worker process by default (`isolation="process"`, `grpo_jax.rewards.isolation`: a timed-out
  call is killed with its process, so a spinning or GIL-holding reward costs about its timeout and nothing
  piles up), or in a daemon thread (`isolation="thread"`, and for functions that cannot be rebuilt in
  another process: lambdas, closures, functions of `__main__`), where a timed-out call is abandoned and runs
  on in the background. Batched calls keep the common case cheap (one call).
- If that call raises, times out, or returns something malformed (wrong length), the function is retried one
  sample at a time, each call again with `timeout_s`, so that one pathological sample costs only itself.
  To bound the cost of a function that hangs on everything, the per-sample retry stops after
  `MAX_SAMPLE_TIMEOUTS` timed-out samples; the rest get the fallback unscored. The worst case for one
  function is therefore about (1 + MAX_SAMPLE_TIMEOUTS) * timeout_s plus the time of the good samples.
- A sample whose score could not be computed (exception, timeout, non-finite or non-numeric value) gets
  `fallback` and is counted in `failures[name]`. A `None` score means "not applicable": it also gets
  `fallback` but is counted in `not_applicable[name]`, not as a failure.
- When more than half of the samples fail for a function, a RuntimeWarning is issued and an error logged,
  naming the function: a run must not quietly train on fallback scores.

math-verify's own timeouts use `signal.alarm`, which works only on a main thread: in the worker process
(whose main thread makes the call) they work; in a scorer thread they are disabled
(`grpo_jax.rewards.math_answer` checks) and ours take over. With `timeout_s=None` every function is called
directly on the caller's thread with no timeout.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import time
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from grpo_jax.rewards import isolation as isolation_lib
from grpo_jax.rewards.isolation import ISOLATIONS
from grpo_jax.rewards.registry import get_reward

logger = logging.getLogger(__name__)

# After this many per-sample timeouts within one call of one function, its remaining samples are not tried.
MAX_SAMPLE_TIMEOUTS = 2

abandoned_threads = isolation_lib.abandoned_threads


@dataclasses.dataclass(frozen=True)
class RewardResult:
  """Scores of N completions.

  total: [N] float32, the weighted sum over functions of their (fallback-substituted) scores.
  per_fn: name -> [N] float32, each function's scores with `fallback` where it failed or did not apply.
  failures: name -> number of samples whose score raised, timed out, or was not a finite number.
  not_applicable: name -> number of samples for which the function returned None.
  """
  total: np.ndarray
  per_fn: dict[str, np.ndarray]
  failures: dict[str, int]
  not_applicable: dict[str, int] = dataclasses.field(default_factory=dict)


def _call_with_timeout(fn: Callable, args: tuple, kwargs: dict, timeout_s: float | None,
                       how: str = "process") -> Any:
  """fn(*args, **kwargs), raising RewardTimeout after timeout_s seconds (module docstring: where it runs)."""
  if timeout_s is None:
    return fn(*args, **kwargs)
  if how == "process":
    return isolation_lib.call_isolated(fn, args, kwargs, timeout_s)
  return isolation_lib.call_in_thread(fn, args, kwargs, timeout_s)


def _as_score(value: Any) -> float | None:
  """A finite float, None for "not applicable"; anything else raises TypeError/ValueError."""
  if value is None:
    return None
  if isinstance(value, (bool, np.bool_)):
    return float(value)
  if not isinstance(value, numbers.Real):
    raise TypeError(f"score {value!r} of type {type(value).__name__} is not a number")
  value = float(value)
  if not math.isfinite(value):
    raise ValueError(f"score {value} is not finite")
  return value


def _check_length(result: Any, n: int) -> list:
  if isinstance(result, np.ndarray):
    result = result.tolist()
  if not isinstance(result, (list, tuple)):
    raise TypeError(f"returned {type(result).__name__}, expected a list of {n} scores")
  if len(result) != n:
    raise ValueError(f"returned {len(result)} scores for {n} completions")
  return list(result)


def _score_one_fn(name: str, fn: Callable, prompts: list, completions: list, columns: dict,
                  timeout_s: float | None, how: str) -> tuple[list[float | None], list[bool], str | None]:
  """Per-sample scores (None = not applicable), per-sample failure flags, and the first error message."""
  n = len(completions)
  try:
    raw = _check_length(_call_with_timeout(fn, (prompts, completions), columns, timeout_s, how), n)
    scores, failed, first_error = [], [], None
    for value in raw:
      try:
        scores.append(_as_score(value))
        failed.append(False)
      except (TypeError, ValueError) as e:
        scores.append(None)
        failed.append(True)
        first_error = first_error or f"{type(e).__name__}: {e}"
    return scores, failed, first_error
  except Exception as e:  # pylint: disable=broad-except  (any bug in a reward fn must not stop the run)
    batch_error = f"{type(e).__name__}: {e}"
    logger.debug("reward %r failed on the batch (%s); retrying per sample", name, batch_error)

  scores, failed = [None] * n, [True] * n
  timeouts, first_error = 0, None
  for i in range(n):
    if timeouts >= MAX_SAMPLE_TIMEOUTS:
      first_error = first_error or "skipped after repeated timeouts"
      break
    one_columns = {key: [values[i]] for key, values in columns.items()}
    try:
      value = _check_length(_call_with_timeout(fn, ([prompts[i]], [completions[i]]), one_columns, timeout_s, how),
                            1)[0]
      scores[i], failed[i] = _as_score(value), False
    except isolation_lib.RewardTimeout as e:
      timeouts += 1
      first_error = first_error or f"timeout: {e}"
    except Exception as e:  # pylint: disable=broad-except
      first_error = first_error or f"{type(e).__name__}: {e}"
  return scores, failed, first_error or batch_error


def score_completions(reward_fns: Sequence[tuple[str, Callable | str, float]], prompts: Sequence[str],
                      completions: Sequence[str], columns: dict[str, Sequence] | None = None,
                      timeout_s: float | None = 10.0, fallback: float = 0.0,
                      isolation: str = "process") -> RewardResult:
  """Scores N completions with every (name, fn, weight); see the module docstring for failure handling.

  Args:
    reward_fns: (name, function or registered name, weight) triples; names must be unique.
    prompts, completions: N strings each (one prompt per completion: repeat a prompt for its group).
    columns: dataset fields, each a sequence of N values aligned with `completions`.
    timeout_s: seconds allowed per call of a function (None: no timeout, call on this thread).
    fallback: the score of a sample whose function failed or returned None.
    isolation: "process" (the reward worker process, where a timeout can kill the call) or "thread".
  """
  prompts, completions = list(prompts), list(completions)
  n = len(completions)
  if len(prompts) != n:
    raise ValueError(f"got {len(prompts)} prompts for {n} completions; repeat each prompt for its group")
  columns = {key: list(values) for key, values in (columns or {}).items()}
  for key, values in columns.items():
    if len(values) != n:
      raise ValueError(f"column {key!r} has {len(values)} entries for {n} completions")
  if timeout_s is not None and timeout_s <= 0:
    raise ValueError(f"timeout_s must be positive or None, got {timeout_s}")
  if isolation not in ISOLATIONS:
    raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
  names = [entry[0] for entry in reward_fns]
  if len(set(names)) != len(names):
    raise ValueError(f"reward names must be unique, got {names}")

  total = np.zeros(n, np.float64)
  per_fn, failures, not_applicable = {}, {}, {}
  for entry in reward_fns:
    if len(entry) != 3:
      raise ValueError(f"each reward must be (name, fn, weight), got {entry!r}")
    name, fn, weight = entry
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
      raise ValueError(f"reward {name!r}: weight must be a finite number, got {weight!r}")
    fn = get_reward(fn)
    start = time.perf_counter()
    scores, failed, error = _score_one_fn(name, fn, prompts, completions, columns, timeout_s, isolation)
    values = np.array([fallback if s is None else s for s in scores], np.float64)
    per_fn[name] = values.astype(np.float32)
    failures[name] = int(sum(failed))
    not_applicable[name] = sum(1 for s, f in zip(scores, failed) if s is None and not f)
    total += float(weight) * values
    if failures[name]:
      logger.warning("reward %r failed on %d of %d samples (fallback %s); first error: %s; timed-out calls "
                     "still running in the background: %d", name, failures[name], n, fallback, error,
                     abandoned_threads())
    if failures[name] * 2 > n:
      message = (f"reward function {name!r} failed on {failures[name]} of {n} samples "
                 f"({time.perf_counter() - start:.1f} s); they were given the fallback score {fallback}, so "
                 f"training on this batch learns little. First error: {error}")
      logger.error(message)
      warnings.warn(message, RuntimeWarning, stacklevel=2)
  return RewardResult(total=total.astype(np.float32), per_fn=per_fn, failures=failures,
                      not_applicable=not_applicable)
