#!/usr/bin/env python
"""Trains a GRPO experiment; re-running with the same --workdir resumes from its latest checkpoint.

  python scripts/train.py --config experiments/default.py --workdir runs/default
  python scripts/train.py --config experiments/default.py:test --config.grpo.beta=0.04 --workdir /tmp/run

`--config FILE.py[:PRESET]` calls FILE's get_config(PRESET); `--config.a.b=value` overrides a field (unknown
fields and wrong types are errors). The base config with every default: grpo_jax/config.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# JAX lets a process use 75% of a GPU's memory unless told otherwise; a training run owns its accelerator, and
# the Countdown recipe at Qwen2.5-3B needs 58.6 GiB for its update alone, over 75% of an 80 GB H100 (59.4 GiB;
# benchmarks/memory_fit.py). Read when the backend starts; an explicit setting wins.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file, optionally FILE.py:PRESET.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, samples and plots.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO level.
  from grpo_jax.train.loop import train
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
