"""Reward calls in a worker process that a timeout can kill.

A Python thread cannot be stopped: a reward that spins keeps a core busy after its timeout, each timed-out
call leaves one more thread behind, and a verifier that holds the GIL (a catastrophic regular expression in
C) stalls the trainer whatever the timeout says. So by default (`reward_isolation="process"`) each call goes
to one long-lived worker process, a fresh interpreter started as `python -m grpo_jax.rewards.worker` (a fresh
interpreter, because forking a process that runs the JAX runtime is unsafe). The worker loads the function,
says so, and calls it; the trainer waits `timeout_s` for the result and otherwise kills the worker (SIGKILL)
and starts a new one at the next call (~0.3 s). A spinning reward therefore costs about its timeout per call
and nothing accumulates. Loading (importing the function's module) does not count toward the timeout.

What can run in the worker: anything it can find again by itself, that is a reward registered under a name
in an importable module (the worker imports that module, which registers it), or a picklable callable (a
module-level function, an instance of a module-level class, a functools.partial of those). Lambdas,
closures and functions defined in `__main__` (a notebook, a script) cannot; `reference(fn)` is None for
them, or the worker reports that it cannot load them, and the scorer then calls them in a thread as before
(logged once per function). Rewards that must share the trainer's memory (a reward model already on the
accelerator) should use `reward_isolation="thread"`.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from typing import Any, Callable

from grpo_jax import timed_calls
from grpo_jax.rewards import registry

logger = logging.getLogger(__name__)

ISOLATIONS = ("process", "thread")
LOAD_TIMEOUT_S = 120.0    # importing the reward's module in a fresh worker (jax, a tokenizer...) may be slow
_HEADER = struct.Struct("<Q")


class RewardTimeout(Exception):
  """The call did not return within its timeout (the worker was killed, or the thread abandoned)."""


class Unloadable(Exception):
  """The worker could not rebuild the function (it is defined in __main__, or its module does not import)."""


def reference(fn: Callable) -> bytes | None:
  """A pickled recipe from which the worker rebuilds `fn`, or None when it cannot (module docstring)."""
  module = getattr(fn, "__module__", None)
  if module in (None, "__main__", "__mp_main__"):
    return None
  name = registry.REWARDS.name_of(fn)
  if name is not None:
    return pickle.dumps(("registered", module, name))
  try:
    return pickle.dumps(("pickled", pickle.dumps(fn)))
  except Exception:  # pylint: disable=broad-except  (lambdas, closures: not picklable)
    return None


def send(stream, obj) -> None:
  send_pickled(stream, pickle.dumps(obj))


def send_pickled(stream, data: bytes) -> None:
  stream.write(_HEADER.pack(len(data)) + data)
  stream.flush()


def _read_exactly(stream, size: int) -> bytes | None:
  chunks, left = [], size
  while left:
    chunk = stream.read(left)
    if not chunk:
      return None
    chunks.append(chunk)
    left -= len(chunk)
  return b"".join(chunks)


def receive(stream) -> Any:
  """The next message, or None at the end of the stream (the other side exited)."""
  header = _read_exactly(stream, _HEADER.size)
  if header is None:
    return None
  data = _read_exactly(stream, _HEADER.unpack(header)[0])
  return None if data is None else pickle.loads(data)


class RewardWorker:
  """One worker process, started on first use and replaced after a timeout or a crash."""

  def __init__(self):
    self._proc: subprocess.Popen | None = None
    self._lock = threading.Lock()
    self.started = 0          # how many worker processes were started (a test reads it)

  @property
  def pid(self) -> int | None:
    return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

  def _start(self) -> None:
    env = dict(os.environ)
    # The worker finds what this process can import: the experiment's directory, the tests' packages...
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    # Its own session: a SIGTERM or Ctrl-C sent to the trainer's process group (a spot VM's shutdown, a terminal)
    # must not kill a call in flight and be scored as a reward failure; the trainer stops it (kill, atexit) and
    # it exits on its own when the trainer's pipe closes.
    self._proc = subprocess.Popen([sys.executable, "-m", "grpo_jax.rewards.worker"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env, close_fds=True, start_new_session=True,
                                  bufsize=0)   # unbuffered: select() must see every byte not yet read
    self.started += 1

  def kill(self) -> None:
    proc, self._proc = self._proc, None
    if proc is not None:
      proc.kill()
      proc.wait()
      proc.stdin.close()
      proc.stdout.close()

  def _wait(self, timeout_s: float | None) -> Any:
    if not select.select([self._proc.stdout], [], [], timeout_s)[0]:
      raise RewardTimeout(f"no result after {timeout_s} s (the reward worker was killed)")
    reply = receive(self._proc.stdout)
    if reply is None:
      code = self._proc.wait()
      raise RuntimeError(f"the reward worker exited with code {code} during the call")
    return reply

  def call(self, ref: bytes, args: tuple, kwargs: dict, timeout_s: float) -> Any:
    """fn(*args, **kwargs) in the worker; raises RewardTimeout, Unloadable, or the function's exception."""
    with self._lock:
      if self._proc is None or self._proc.poll() is not None:
        self.kill()
        self._start()
      try:
        send(self._proc.stdin, (ref, args, kwargs))
        status, payload = self._wait(LOAD_TIMEOUT_S)
        if status == "started":
          status, payload = self._wait(timeout_s)
      except BaseException:
        self.kill()   # a timeout, a crash or an interrupt: never reuse a worker in an unknown state
        raise
    if status == "ok":
      return payload
    if status == "unloadable":
      raise Unloadable(payload)
    raise payload  # status "error": the function's own exception


_WORKER = RewardWorker()
atexit.register(_WORKER.kill)
_in_thread_logged: set[str] = set()


def worker() -> RewardWorker:
  return _WORKER


def call_isolated(fn: Callable, args: tuple, kwargs: dict, timeout_s: float) -> Any:
  """fn(*args, **kwargs) in the worker process when it can run there, else in a thread (both with timeout)."""
  ref = reference(fn)
  if ref is not None:
    try:
      return _WORKER.call(ref, args, kwargs, timeout_s)
    except Unloadable as e:
      _log_in_thread(fn, str(e))
  else:
    _log_in_thread(fn, "a lambda, closure or function of __main__ cannot be rebuilt in another process")
  return call_in_thread(fn, args, kwargs, timeout_s)


def _log_in_thread(fn: Callable, why: str) -> None:
  name = getattr(fn, "__qualname__", repr(fn))
  if name not in _in_thread_logged:
    _in_thread_logged.add(name)
    logger.warning("reward %s runs in a thread, where a timeout cannot stop it (%s); define it at module level "
                   "in an importable module to run it in the reward worker process", name, why)


_abandoned = timed_calls.Abandoned()  # timed-out reward calls in threads, counted until they finish


def abandoned_threads() -> int:
  """How many timed-out reward calls are still running in threads in the background."""
  return _abandoned.count()


def call_in_thread(fn: Callable, args: tuple, kwargs: dict, timeout_s: float) -> Any:
  """fn(*args, **kwargs) in a daemon thread, raising RewardTimeout after timeout_s (the call is abandoned)."""
  ((ok, value),) = timed_calls.call_all([(lambda: fn(*args, **kwargs), ())], timeout_s, _abandoned,
                                        name=f"reward:{getattr(fn, '__name__', 'fn')}")
  if ok:
    return value
  if isinstance(value, TimeoutError):
    raise RewardTimeout(f"no result after {timeout_s} s")
  raise value
