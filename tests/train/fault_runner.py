"""Runs the default experiment's test preset in a subprocess and SIGKILLs itself at a chosen point.

  python -m tests.train.fault_runner WORKDIR [POINT N [SIGNAL]]

POINT (the N-th time it is reached; see KILL_POINTS and SIGNAL_POINTS) is found by wrapping the function that
marks it, so the package carries no test hooks. Without POINT the run goes to the end (an uninterrupted run, or
a resume). SIGNAL instead of the SIGKILL: "term" sends SIGTERM to this process, "term_group" to its whole
process group (start it in a session of its own), "int" SIGINT; the run goes on to stop by itself; "term_stall"
sends SIGTERM and then never returns from the call (the rescue save must end the process).
"""
from __future__ import annotations

import os
import signal
import sys
import time

NUM_STEPS = 6
STALENESS_VARIABLE = "FAULT_RUNNER_STALENESS"  # rollout.staleness of the run (0 when unset)
SAMPLER_DEVICES_VARIABLE = "FAULT_RUNNER_SAMPLER_DEVICES"  # rollout.sampler_devices (0 when unset)


def even_length(prompts, completions, **unused):
  """A reward the tiny model meets about half the time (its exact-match reward is 0): the policy moves."""
  return [float(len(c) % 2 == 0) for c in completions]


def config():
  from tests.train.conftest import load_experiment
  c = load_experiment("default")("test")
  c.num_steps = NUM_STEPS
  staleness = int(os.environ.get(STALENESS_VARIABLE, "0"))
  if staleness:  # rollouts ahead of the update, and a reward that moves the policy between sampling and update
    c.rollout.staleness = staleness
    c.reward_funcs = ("tests.train.fault_runner:even_length",)
    c.optim.learning_rate = 3e-2
  c.rollout.sampler_devices = int(os.environ.get(SAMPLER_DEVICES_VARIABLE, "0"))
  c.checkpoint.every = 2
  c.checkpoint.keep = 2
  c.eval.every = 3
  c.warmstart.max_steps = 3          # three warm-start steps, so a kill can fall between two of them
  c.log.progress_bar = False
  return c


_ACTION = ["kill"]


def _kill():
  sys.stdout.flush()
  action = _ACTION[0]
  if action == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
  elif action == "term_group":
    os.killpg(os.getpgrp(), signal.SIGTERM)
  elif action == "term_stall":  # SIGTERM, then this call never ends: only a save at once ends the process
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(600)
  else:
    os.kill(os.getpid(), {"term": signal.SIGTERM, "int": signal.SIGINT}[action])


def _kill_on_call(owner, name, nth, after=False, then=None):
  """Wraps owner.name: the nth call SIGKILLs the process (before the call, or right after it returns, after
  `then(*args)` when given)."""
  original = getattr(owner, name)
  calls = [0]

  def wrapped(*args, **kwargs):
    calls[0] += 1
    if calls[0] == nth and not after:
      _kill()
    out = original(*args, **kwargs)
    if calls[0] == nth and after:
      if then is not None:
        then(*args)
      _kill()
    return out

  setattr(owner, name, wrapped)


def _kill_in_warmstart_step(nth):
  """The nth warm-start update: killed while it computes."""
  from grpo_jax.train import warmstart
  make = warmstart.make_sft_step

  def make_killing(*args, **kwargs):
    step = make(*args, **kwargs)
    calls = [0]

    def killing(*a, **k):
      calls[0] += 1
      if calls[0] == nth:
        _kill()
      return step(*a, **k)
    return killing

  warmstart.make_sft_step = make_killing


def arm(point: str, nth: int) -> None:
  import orbax.checkpoint as ocp

  from grpo_jax.train import producer, run
  from grpo_jax.persist import checkpoint
  if point == "warmstart_step":
    _kill_in_warmstart_step(nth)
  elif point == "after_warmstart_save":           # the warm start is saved, checkpoint 0 is not
    _kill_on_call(checkpoint, "save_initial_state", nth, after=True)
  elif point == "mid_checkpoint_save":            # the state item written, its metadata not, nothing committed
    _kill_on_call(ocp.JsonCheckpointHandler, "async_save", nth)
  elif point == "after_checkpoint_save":          # a checkpoint committed, the next step's metrics not written
    _kill_on_call(checkpoint.Checkpointer, "save", nth, after=True, then=lambda ck, *_: ck.wait())
  elif point == "during_async_write":             # save returned, its files still being written in the background
    _kill_on_call(checkpoint.Checkpointer, "save", nth, after=True)
  elif point == "during_eval":                    # in the middle of a held-out evaluation
    _kill_on_call(run, "evaluate", nth)
  elif point == "loading":                        # building the run's parts (model, data, programs)
    _kill_on_call(run.Run, "__init__", nth)
  elif point == "rollout":                        # a rollout's sampling (step n's, or one ahead of its update)
    _kill_on_call(producer.Producer, "sample", nth)
  elif point == "reward":                         # scoring a step's completions
    from grpo_jax.train import rollout
    _kill_on_call(rollout, "grade", nth)
  elif point == "update":                         # a step's update (it donates the state)
    _kill_on_call(run.Run, "update", nth)
  elif point == "checkpoint_save":                # a checkpoint being started
    _kill_on_call(checkpoint.Checkpointer, "save", nth)
  else:
    raise ValueError(f"unknown kill point {point!r}")


# (point, n): the n-th time. Evaluations: warm-start evals come first (eval_every 1, 3 steps), then GRPO's.
KILL_POINTS = [("warmstart_step", 2), ("after_warmstart_save", 1), ("mid_checkpoint_save", 1),
               ("mid_checkpoint_save", 3), ("after_checkpoint_save", 1), ("after_checkpoint_save", 2),
               ("during_async_write", 2),
               ("during_eval", 2), ("during_eval", 5)]


# SIGTERM / SIGINT at these points: the run stops by itself (exit code 75) with the last completed step saved.
# Rollouts and updates of steps 1..6 (reward: grade calls, G groups per call); evaluations as in KILL_POINTS.
SIGNAL_POINTS = [("loading", 1, "term"), ("warmstart_step", 2, "term"), ("during_eval", 1, "term"),
                 ("during_eval", 4, "term"), ("rollout", 3, "term"), ("rollout", 4, "int"),
                 ("reward", 5, "term_group"), ("update", 3, "term"), ("checkpoint_save", 3, "term"),
                 ("during_async_write", 2, "term")]


def main(argv):
  workdir = argv[0]
  if len(argv) > 3:
    _ACTION[0] = argv[3]
  if len(argv) > 1:
    arm(argv[1], int(argv[2]))
  from grpo_jax.errors import EXIT_PREEMPTED, Preempted
  from grpo_jax.train import loop
  try:
    loop.train(config(), workdir)
  except Preempted:
    from grpo_jax.persist.preemption import exit_preempted
    exit_preempted()


if __name__ == "__main__":
  main(sys.argv[1:])
