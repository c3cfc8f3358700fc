"""One process of a multi-process GRPO run (run by test_multihost.py; also the single-process reference).

  python multihost_worker.py WORKDIR PROCESS_ID NUM_PROCESSES PORT LOCAL_DEVICES [--resume]
      [--sigterm_before_update=N] [--config.x=y ...]

Runs the trainer (`grpo_jax.train.loop.train`) on the tiny default-task preset with jax.distributed started
from `config.distributed` (when NUM_PROCESSES > 1) for 3 steps (with --resume: 2, then a resume for the third,
whose restore checks the state fingerprint), then restores the final checkpoint collectively and writes
this process's full copy of the parameters to WORKDIR/params_<PROCESS_ID>.npz. With --sigterm_before_update=N
this process sends itself SIGTERM as its N-th update starts; a preempted run exits with code 75.

The optimizer is SGD with momentum (after the run's global-norm clipping), not the trainer's AdamW: the test
compares runs of different programs (two processes, one process), and AdamW divides each coordinate by its own
gradient's size, so that a gradient at its rounding error takes a step the CPU decides (issue 68); SGD is linear
in the gradients, and the momentum is optimizer state that the checkpoints save and the resume restores.
"""
from __future__ import annotations

import os
import sys

workdir, pid, nproc, port, local_devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \
    int(sys.argv[5])
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={local_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from tests.train.conftest import load_experiment  # noqa: E402


def main():
  config = load_experiment("default")("test")
  config.warmstart.enabled = False
  config.log.plot = False
  config.log.tensorboard = False
  config.eval.every = 100         # evaluation at steps 0 and 2 only
  config.checkpoint.every = 100   # checkpoints at steps 0 and 2
  config.grpo.beta = 0.04         # exercise the reference model too
  config.optim.learning_rate = 0.1  # SGD's (below): the 3 updates move parameters by up to 0.15
  resume = "--resume" in sys.argv[6:]  # 2 steps, then a resume for the third; else 3 steps straight
  sigterm = [int(a.split("=")[1]) for a in sys.argv[6:] if a.startswith("--sigterm_before_update=")]
  if sigterm:
    _sigterm_before_update(sigterm[0])
  for arg in [a for a in sys.argv[6:] if a.startswith("--config.")]:  # --config.a.b=value (int/float/str)
    key, value = arg[len("--config."):].split("=", 1)
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = type(node[leaf])(value) if not isinstance(node[leaf], bool) else value == "True"
  if nproc > 1:
    config.distributed.coordinator_address = f"localhost:{port}"
    config.distributed.num_processes = nproc
    config.distributed.process_id = pid

  from grpo_jax.errors import EXIT_PREEMPTED, Preempted
  from grpo_jax.train import loop, run
  from grpo_jax.persist import checkpoint
  from grpo_jax.persist.layout import RunFiles
  run.make_optimizer = _momentum_sgd
  config.num_steps = 2 if resume else 3
  try:
    loop.train(config, workdir)
  except Preempted as e:
    print(f"[worker {pid}] preempted: {e}", flush=True)
    sys.exit(EXIT_PREEMPTED)
  assert jax.process_count() == nproc and jax.process_index() == pid
  if resume:  # the restore checks the fingerprint the processes stored together at step 2 (a mismatch would
    config.num_steps = 3  # set that checkpoint aside and fall back to step 0)
    loop.train(config, workdir)

  # Restore the last checkpoint (collectively) and dump this process's view of the parameters.
  # No target: plain arrays (whose key paths differ from the saved State's, so no checksum check here).
  ckpt = checkpoint.Checkpointer(RunFiles(workdir).checkpoints, keep=2, verify=False)
  restored = ckpt.restore_latest(None)
  ckpt.close()
  assert restored is not None and restored.step == config.num_steps, restored and restored.step
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(restored.state["params"])[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      leaf = multihost_utils.process_allgather(leaf, tiled=True)
    flat[jax.tree_util.keystr(path)] = np.asarray(leaf)
  np.savez(os.path.join(workdir, f"params_{pid}.npz"), **flat)
  print(f"[worker {pid}] devices {jax.local_device_count()}/{jax.device_count()} done", flush=True)


def _momentum_sgd(optim, schedule):
  """The trainer's optimizer (grpo_jax/train/optim.py) with SGD with momentum in place of AdamW."""
  import optax
  return optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), optax.sgd(schedule, momentum=0.9))


def _sigterm_before_update(nth: int) -> None:
  import signal

  from grpo_jax.train import run
  update, calls = run.Run.update, [0]

  def signalling(*args, **kwargs):
    calls[0] += 1
    if calls[0] == nth:
      os.kill(os.getpid(), signal.SIGTERM)
    return update(*args, **kwargs)
  run.Run.update = signalling


if __name__ == "__main__":
  main()
