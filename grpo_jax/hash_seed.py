"""One hash seed for every launch, so that a data generator that iterates over a set of strings gives the same
items in every process.

Python salts `hash(str)` per process unless PYTHONHASHSEED is set, and with it the iteration order of sets and
of dicts built from sets. Some procedural datasets depend on that order: reasoning-gym 0.1.25's
isomorphic_strings gives other questions (with the same answers) for the same dataset seed in another process,
so a held-out set would differ from run to run and a resumed run would train on other questions than an
uninterrupted one. The hash seed can only be chosen before the interpreter starts, hence the re-execution.
"""
from __future__ import annotations

import os
import sys

DEFAULT = "0"


def pin() -> None:
  """Re-executes this process with PYTHONHASHSEED=0 when the variable is unset (an explicit value wins).

  Call it first thing in a launcher, before anything slow is imported: the process image is replaced (same pid,
  same arguments and interpreter options, `sys.orig_argv`), so the cost is one interpreter start.
  """
  if "PYTHONHASHSEED" in os.environ:
    return
  os.environ["PYTHONHASHSEED"] = DEFAULT
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
