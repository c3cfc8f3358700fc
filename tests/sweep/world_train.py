"""A stand-in for scripts/train.py in a multi-host member on Ray (tests/sweep/test_ray_cluster.py): it forms
the world as the trainer does (grpo_jax.train.distributed.initialize with the default `distributed` section,
which reads the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID that the Ray backend sets), sums
one number per device over every device of every process, and has process 0 write what it saw to
WORKDIR/world.json and print "[done]". That such a world trains as one process does is
tests/distributed/test_multihost.py's."""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax.settings import DistributedSettings
from grpo_jax.train import distributed


def main(argv):
  workdir = argv[argv.index("--workdir") + 1]
  formed = distributed.initialize(DistributedSettings())
  mesh = jax.make_mesh((jax.device_count(),), ("x",))
  ones = jax.make_array_from_callback((jax.device_count(),), NamedSharding(mesh, PartitionSpec("x")),
                                      lambda idx: np.ones(1, np.float32))
  total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(ones))
  if distributed.is_main():
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "world.json"), "w") as f:
      json.dump({"formed": formed, "processes": jax.process_count(), "devices": jax.device_count(),
                 "local_devices": jax.local_device_count(), "sum": total}, f)
    print("[done]")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
