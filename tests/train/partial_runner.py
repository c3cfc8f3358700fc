"""Runs the default experiment's test preset with rollouts that span updates (staleness 2, decode budget 1 of 4
tokens: every batch is decoded by three policies), inline or with the sampler on a device of its own, and stops
itself at a segment (tests/train/test_partial_rollouts.py):

  python -m tests.train.partial_runner WORKDIR SAMPLER_DEVICES [N ACTION]

N: the N-th segment (`partial.segment` call); ACTION: "kill" (SIGKILL before it), or fault_runner's signal
actions ("term": SIGTERM, the run stops by itself; "term_stall": SIGTERM and the segment never ends, so only a
save at once ends the process). Without N the run goes to the end (an uninterrupted run, or a resume).
Overlapped runs go under `jax.transfer_guard_device_to_device("disallow")`.
Overlapped (SAMPLER_DEVICES 1, with 2 devices), segments 2, 3, 5, 6, 8, 9 run during updates 1, 1, 2, 2, 3, 3.
"""
from __future__ import annotations

import sys

from tests.train import fault_runner

NUM_STEPS, STALENESS, BUDGET = 5, 2, 1


def config(sampler_devices: int = 0):
  from tests.train.conftest import load_experiment
  c = load_experiment("default")("test")
  c.num_steps, c.warmstart.enabled = NUM_STEPS, False
  c.reward_funcs = ("tests.train.fault_runner:even_length",)
  c.optim.learning_rate = 3e-2  # large steps: a token of the wrong policy shows in every metric
  c.eval.every, c.checkpoint.every, c.log.plot, c.log.tensorboard = 100, 1, False, False
  c.log.progress_bar, c.reward_isolation = False, "thread"
  c.rollout.staleness, c.rollout.decode_budget, c.rollout.sampler_devices = STALENESS, BUDGET, sampler_devices
  return c


def main(argv):
  workdir, sampler_devices = argv[0], int(argv[1])
  if len(argv) > 2:
    from grpo_jax.train import partial
    fault_runner._ACTION[0] = argv[3]
    fault_runner._kill_on_call(partial, "segment", int(argv[2]))
  import jax
  from grpo_jax.train import loop
  from grpo_jax.errors import Preempted
  try:  # overlapped: no implicit copy between the devices (a sampler program reading the trainer's arrays)
    with jax.transfer_guard_device_to_device("disallow" if sampler_devices else "allow"):
      loop.train(config(sampler_devices), workdir)
  except Preempted:
    from grpo_jax.persist.preemption import exit_preempted
    exit_preempted()


if __name__ == "__main__":
  main(sys.argv[1:])
