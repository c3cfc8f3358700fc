"""Errors that are the user's to fix: a bad config value, a workdir that holds another run or is in use, a
missing file or optional extra. The launchers (grpo-train, grpo-sweep) print such an error as one
line and exit with `EXIT_USER_ERROR`; `--debug` shows the traceback. Anything else is a bug and raises.

The sweep runners read that exit code too: retrying a member cannot fix a user error, so it fails once.

`EXIT_PREEMPTED` (75, sysexits' EX_TEMPFAIL: "try again later") is the trainer's exit after SIGTERM or SIGINT
(a spot VM reclaimed, a Ctrl-C): it saved the last completed step and the same command resumes there. Sweeps
retry such a member without counting it as a failed attempt.
"""
from __future__ import annotations

EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 75


class UserError(Exception):
  """A mistake in what was asked for; the message names the problem and the fix."""


class ConfigError(UserError, ValueError):
  """A config key or value that is wrong (also a ValueError, as config errors always were)."""


class WorkdirError(UserError, RuntimeError):
  """A workdir that holds another run, is in use, or would lose its history."""


class CheckpointSaveError(UserError, RuntimeError):
  """A checkpoint that could not be written (a full disk, a lost mount): the run stops with its history kept."""


class Preempted(BaseException):
  """The run was asked to stop (SIGTERM, SIGINT, a cloud's preemption notice) and stopped with its last completed
  step saved; the same command resumes it. A BaseException, as KeyboardInterrupt is: a handler of `Exception`
  (a checkpoint restore that sets aside what it cannot read, a reward's failure count) must never swallow it."""

  def __init__(self, reason: str, step: int | None = None):
    super().__init__(reason if step is None else f"{reason} (step {step} saved)")
    self.reason = reason
    self.step = step
