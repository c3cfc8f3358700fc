"""`grpo-train`: trains a GRPO experiment; re-running with the same --workdir resumes from its latest checkpoint.

  grpo-train --config experiments/default.py --workdir runs/default
  grpo-train --config experiments/default.py:test --config.grpo.beta=0.04 --workdir /tmp/run

`python -m grpo_jax.commands.train` and `python scripts/train.py` are the same command.

`--config FILE.py[:PRESET]` calls FILE's get_config(PRESET); `--config.a.b=value` overrides a field (unknown
fields and wrong types are errors). The base config with every default: grpo_jax/config.py.
"""
import os

from absl import app, flags, logging
from ml_collections import config_flags

from grpo_jax import config as config_lib
from grpo_jax import hash_seed, signals
from grpo_jax.commands import exit_user_error
from grpo_jax.commands.launch import preempted_while_starting
from grpo_jax.errors import Preempted, UserError
from grpo_jax.train.loop import train
from grpo_jax.persist.preemption import exit_preempted

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file, optionally FILE.py:PRESET.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, samples and plots.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the traceback of a user error (bad key or value, busy workdir).")
flags.mark_flags_as_required(["config", "workdir"])


def _parse_flags(argv):
  # absl exits with code 1 and a usage hint on a bad flag value; ml_collections raises AttributeError (a bare
  # key name) for a --config.KEY that the config lacks. Both are the user's to fix.
  for i, arg in enumerate(argv):  # ml_collections reports a missing config file only when the config is first read
    path = argv[i + 1] if arg == "--config" and i + 1 < len(argv) else arg[len("--config="):] \
        if arg.startswith("--config=") else None
    if path is not None and not os.path.isfile(path.partition(":")[0]):
      exit_user_error("grpo-train",
                      f"--config {path}: no such file {path.partition(':')[0]!r} (relative to {os.getcwd()})")
  try:
    parsed = flags.FLAGS(argv)
  except flags.Error as e:
    if "--debug" in argv:
      raise
    exit_user_error("grpo-train", _without_traceback(str(e)))
  except (AttributeError, KeyError):
    # ml_collections rejects a --config.KEY that the config lacks: one line naming the closest keys.
    known = set(config_lib.keys())
    keys = [a[len("--config."):].split("=", 1)[0] for a in argv if a.startswith("--config.")]  # --config.KEY[=V]
    unknown = [key for key in keys if key not in known]
    if "--debug" in argv or not unknown:
      raise
    exit_user_error("grpo-train", config_lib.unknown_key_message(unknown[0]))
  return parsed


def _without_traceback(message: str) -> str:
  """ml_collections puts the whole traceback of an error raised by a config file's get_config (an unknown preset,
  say) into its flag error: keep what precedes it and the exception's own last line."""
  head, found, trace = message.partition("Traceback (most recent call last):")
  if not found:
    return message
  last = [line for line in trace.strip().splitlines() if line.strip()][-1]
  return head.rstrip(": \n\t") + ": " + last.strip()


def _train(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO level.
  try:
    train(_CONFIG.value, _WORKDIR.value)
  except UserError as e:
    if _DEBUG.value:
      raise
    exit_user_error("grpo-train", e)
  except Preempted:  # SIGTERM / SIGINT: the last completed step is saved (train printed which); rerun to resume
    exit_preempted(tell_coordinator=True)  # not sys.exit: XLA may still be compiling what the signal interrupted


def main() -> None:
  """The `grpo-train` command."""
  signals.install(preempted_while_starting)  # again (`python -m grpo_jax.commands.train` starts here)
  # JAX lets a process use 75% of a GPU's memory unless told otherwise; a training run owns its accelerator, and
  # the larger recipes' updates need more than 75% of an 80 GB H100 (benchmarks/README.md, "Figures behind code
  # choices"). Read when the backend starts (after this); an explicit setting wins.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
  hash_seed.pin()  # the same data in every process (grpo_jax/hash_seed.py)
  app.run(_train, flags_parser=_parse_flags)


if __name__ == "__main__":
  main()
