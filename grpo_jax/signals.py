"""The process's signal handlers, installed here and nowhere else: whoever holds SIGTERM and SIGINT at a time (the
launchers while they start, the trainer's preemption, the sweep driver, the reward worker) sets them through
`install` and gives them back with `restore`. Python runs a handler in the main thread only, and only the main
thread may set one: elsewhere (a notebook's worker thread) nothing is installed."""
from __future__ import annotations

import contextlib
import signal
import threading

STOP = (signal.SIGTERM, signal.SIGINT)  # what a preemption, a cluster's time limit or Ctrl-C sends


def install(handler, signals=STOP) -> dict:
  """`handler` (a function of (signum, frame), or signal.SIG_IGN) for `signals`; returns the handlers it replaced,
  for `restore` ({} off the main thread, where nothing is installed)."""
  if threading.current_thread() is not threading.main_thread():
    return {}
  return {sig: signal.signal(sig, handler) for sig in signals}


def restore(previous: dict) -> None:
  for sig, handler in previous.items():
    signal.signal(sig, handler)


@contextlib.contextmanager
def handled(handler, signals=STOP):
  """`handler` for `signals` within the block, the previous handlers again after it."""
  previous = install(handler, signals)
  try:
    yield
  finally:
    restore(previous)
