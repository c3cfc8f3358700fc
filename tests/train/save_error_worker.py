"""Run by test_checkpoint.py in a subprocess: a checkpoint whose files cannot be written (files capped at 64 KiB
with RLIMIT_FSIZE, as a full disk refuses them) must surface from `Checkpointer.check` within a moment of the
failed background write. Prints one JSON line."""
import json
import resource
import signal
import sys
import time

import jax

from grpo_jax.errors import CheckpointSaveError
from grpo_jax.persist.checkpoint import Checkpointer

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG instead of killing us
ck = Checkpointer(sys.argv[1], keep=2)
state = {"w": jax.random.normal(jax.random.key(0), (512, 512))}  # 1 MiB of incompressible float32
ck.save(1, state, {})
ck.wait()
ck.check()  # a save that succeeded: nothing to report
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
t0 = time.time()
ck.save(2, state, {})
error = None
while error is None and time.time() - t0 < 60:
  try:
    ck.check()
  except CheckpointSaveError as e:
    error = str(e)
  time.sleep(0.05)
print(json.dumps({"error": error, "seconds": time.time() - t0}))
