"""Runs the default experiment's test preset on 2 virtual CPU devices, the sampler on the second (overlapped) or
inline, and prints what tests/train/test_overlap.py checks as a JSON line:

  python tests/train/overlap_worker.py WORKDIR MODE [EXPERIMENT]

Staleness 1, 4 steps. MODE "overlapped" (rollout.sampler_devices = 1): under
`jax.transfer_guard_device_to_device("disallow")` (an implicit copy between devices raises). Every update is slowed by a loop of matmuls (HOLD_ITERATIONS) and stamped "update_end" by a thread that
waits for its outputs; each sampler prefill stamps the host clock from a host callback when it runs. (Not a host
callback in the update: XLA:CPU runs a program holding one at its dispatch, so the host would wait for it.)
"""
from __future__ import annotations

import json
import sys
import threading
import time

import jax
import jax.numpy as jnp

from grpo_jax.sampling.sampler import Sampler
from grpo_jax.train import loop
from grpo_jax.train import run as run_lib
from tests.train.conftest import load_experiment

HOLD_ITERATIONS = 600  # of a 256 x 256 matmul: about 0.2 s here
events: list[tuple[str, float]] = []


def _stamp(name: str):
  return lambda *unused: events.append((name, time.perf_counter()))


def _held_update(make_train_step):
  """make_train_step whose update also runs HOLD_ITERATIONS matmuls (their result feeds the loss, times 0)."""
  def make(*args, **kwargs):
    step = make_train_step(*args, **kwargs)

    def held(params, opt_state, batch):
      params, opt_state, metrics = step(params, opt_state, batch)
      y = jax.lax.fori_loop(0, HOLD_ITERATIONS, lambda i, y: jnp.tanh(y @ y), jnp.full((256, 256), 1 / 256))
      return params, opt_state, dict(metrics, loss=metrics["loss"] + 0 * y[0, 0])
    return held
  return make


def _stamped_prefill(prefill_fn):
  def prefill(self, state, prompt_RxP, *args, **kwargs):
    jax.debug.callback(_stamp("prefill"), prompt_RxP[0, 0])  # when the program runs (it reads the prompts)
    return prefill_fn(self, state, prompt_RxP, *args, **kwargs)
  return prefill


def _returning(update):
  """Run.update stamping its return (an upper bound of the update's end that no later program can pass, where
  the waiting thread's stamp may come late)."""
  def wrapped(*args, **kwargs):
    out = update(*args, **kwargs)
    _stamp("update_returned")()
    return out
  return wrapped


def _stamped_updates(init):
  """Run.__init__ whose train_step stamps its dispatch, and its end from a thread waiting for its outputs."""
  def wrapped(self, *args, **kwargs):
    init(self, *args, **kwargs)
    train_step = self.train_step

    def stamped(*a):
      _stamp("update_dispatch")()
      out = train_step(*a)
      threading.Thread(target=lambda: (jax.block_until_ready(out), _stamp("update_end")())).start()
      return out
    self.train_step = stamped
  return wrapped


def main(workdir: str, mode: str, experiment: str = "default") -> None:
  config = load_experiment(experiment)("test")
  config.num_steps, config.rollout.staleness = 4, 1
  config.rollout.sampler_devices = 1 if mode == "overlapped" else 0
  config.warmstart.enabled, config.log.plot, config.log.tensorboard = False, False, False
  if experiment == "default":  # DAPO's dynamic sampling (several sampler calls and round keys per batch), and a
    config.grpo.dynamic_sampling = True  # reward that moves the policy
    config.reward_funcs = ("tests.train.fault_runner:even_length",)
    config.optim.learning_rate = 0.03
  run_lib.make_train_step = _held_update(run_lib.make_train_step)
  Sampler._prefill_fn = _stamped_prefill(Sampler._prefill_fn)
  run_lib.Run.__init__ = _stamped_updates(run_lib.Run.__init__)
  run_lib.Run.update = _returning(run_lib.Run.update)
  with jax.transfer_guard_device_to_device("disallow" if mode == "overlapped" else "allow"):
    loop.train(config, workdir)
  print(json.dumps({"events": events}))


if __name__ == "__main__":
  main(*sys.argv[1:])
