"""The commands users install (setup.cfg's console_scripts), each a module with a `main()`:

  grpo-train     train.py      trains an experiment into a workdir (resumes one)
  grpo-sweep     sweep.py      runs an experiment file's sweep, locally or on a Ray cluster
  grpo-evaluate  evaluate.py   evaluates a run's checkpoint or an experiment's starting model
  grpo-report    report.py     tables and curves of a sweep directory
  grpo-export    export.py     a run's policy as a Hugging Face directory
  grpo-plot      plot.py       training curves of one run or several

memory_estimate.py is run as `python -m grpo_jax.commands.memory_estimate`. `python -m grpo_jax.commands.X` and
`python scripts/X.py` (what a Ray job's uploaded working directory runs) are the same commands.
"""

import argparse
import os
import sys
from typing import Callable, NoReturn, TypeVar

from grpo_jax.errors import EXIT_USER_ERROR, UserError

T = TypeVar("T")
# What a command's own inputs raise when the user names something that is not there or not valid: a missing run
# or sweep directory, an unknown preset of an experiment file, a bad value.
MISTAKES = (UserError, FileNotFoundError, NotADirectoryError, ValueError)


def exit_user_error(prog: str, error) -> NoReturn:
  """Ends the command on a user's mistake: `prog: error: <message>` on one line, exit code 2 (grpo_jax/errors.py)."""
  text = error.args[0] if isinstance(error, KeyError) and error.args else error
  print(f"{prog}: error: {' '.join(str(text).split())}", file=sys.stderr)
  sys.exit(EXIT_USER_ERROR)


def exit_on_mistake(prog: str, run: Callable[[], T], mistakes: tuple = MISTAKES) -> T:
  """`run()`; a user's mistake ends in one line and exit code 2, its traceback only with --debug (or
  GRPO_JAX_DEBUG=1), since anything else is a bug and raises."""
  try:
    return run()
  except mistakes as e:
    if "--debug" in sys.argv[1:] or os.environ.get("GRPO_JAX_DEBUG"):
      raise
    exit_user_error(prog, e)


def command_parser(prog: str, doc: str) -> argparse.ArgumentParser:
  """A command's parser: `doc` (its module docstring) as its help, and --debug (`exit_on_mistake`)."""
  p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--debug", action="store_true", help="a mistake's traceback instead of its one line")
  return p
