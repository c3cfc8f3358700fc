"""Calls with a time limit, in daemon threads: the reward functions' thread mode (grpo_jax/rewards/isolation.py)
and the environments' reset/step calls of multi-turn episodes (grpo_jax/sampling/episodes.py).

A thread cannot be stopped from outside, so a call that does not return in time is abandoned: its late result
is ignored, and it is counted (`Abandoned.count`) until it ends, so the run can report it.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence


class Abandoned:
  """The threads of timed-out calls that are still running."""

  def __init__(self):
    self._threads: set[threading.Thread] = set()
    self._lock = threading.Lock()

  def add(self, threads) -> None:
    with self._lock:
      self._threads.update(threads)

  def count(self) -> int:
    with self._lock:
      self._threads.difference_update([t for t in self._threads if not t.is_alive()])
      return len(self._threads)


def call_all(calls: Sequence[tuple[Callable, tuple]], timeout_s: float, abandoned: Abandoned, *,
             max_concurrent: int | None = None, name: str = "timed-call") -> list[tuple[bool, Any]]:
  """Each fn(*args) of `calls` in a daemon thread, at most `max_concurrent` at once (default: all), each given
  `timeout_s` seconds from its start: (True, value) or (False, the exception; TimeoutError when it did not answer
  in time, its thread then counted in `abandoned`)."""
  results: list[Any] = [None] * len(calls)

  def target(i, fn, args):
    try:
      results[i] = (True, fn(*args))
    except BaseException as e:  # handed to the caller
      results[i] = (False, e)

  step = max_concurrent or max(len(calls), 1)
  for lo in range(0, len(calls), step):
    wave = [threading.Thread(target=target, args=(i, *calls[i]), daemon=True, name=name)
            for i in range(lo, min(lo + step, len(calls)))]
    deadline = time.monotonic() + timeout_s
    for thread in wave:
      thread.start()
    for thread in wave:
      thread.join(max(0.0, deadline - time.monotonic()))
    abandoned.add(t for t in wave if t.is_alive())
  return [r if r is not None else (False, TimeoutError(f"no answer within {timeout_s:g} s")) for r in results]
