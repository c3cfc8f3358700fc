"""The reward worker process (`python -m grpo_jax.rewards.worker`, started by `grpo_jax.rewards.isolation`).

It reads (reference, args, kwargs) requests from stdin, rebuilds the function once per reference, answers
("started", None) once the function is loaded (so the caller's timeout does not count imports), then ("ok",
result) or ("error", exception); ("unloadable", message) when the function cannot be rebuilt here. The
protocol uses a private copy of stdout; the reward's own prints go to stderr.

SIGTERM and SIGINT are ignored: the trainer decides when a preempted run stops (grpo_jax/persist/preemption.py),
and a call it started finishes; the worker exits when the trainer closes its pipe or kills it.
"""
from __future__ import annotations

import signal

from grpo_jax import signals

signals.install(signal.SIG_IGN)  # first, before the imports below take their time

import importlib  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402

from grpo_jax.rewards import isolation, registry  # noqa: E402


def _load(ref: bytes):
  kind, *rest = pickle.loads(ref)
  if kind == "registered":
    module, name = rest
    importlib.import_module(module)   # registers the reward, as it did in the trainer
    return registry.get_reward(name)
  return pickle.loads(rest[0])


def _portable(error: BaseException) -> BaseException:
  """The exception itself when it survives pickling, else a RuntimeError with its type and message."""
  try:
    pickle.loads(pickle.dumps(error))
    return error
  except Exception:  # pylint: disable=broad-except
    return RuntimeError(f"{type(error).__name__}: {error}")


def main() -> None:
  out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
  requests = sys.stdin.buffer
  loaded = {}
  while True:
    request = isolation.receive(requests)
    if request is None:
      return
    ref, args, kwargs = request
    try:
      if ref not in loaded:
        loaded[ref] = _load(ref)
    except Exception as e:  # pylint: disable=broad-except
      isolation.send(out, ("unloadable", f"{type(e).__name__}: {e}"))
      continue
    isolation.send(out, ("started", None))
    try:
      reply = pickle.dumps(("ok", loaded[ref](*args, **kwargs)))   # a result that cannot be pickled fails here
    except Exception as e:  # pylint: disable=broad-except  (reported to the trainer, which counts it)
      reply = pickle.dumps(("error", _portable(e)))
    isolation.send_pickled(out, reply)


if __name__ == "__main__":
  main()
