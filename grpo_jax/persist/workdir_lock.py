"""One run per workdir: the lock a run holds on its workdir, one interface for a local directory and a store.

  local           an exclusive `flock` on WORKDIR/.lock, held while the run lives; the kernel drops it when the
                  process dies, however it dies, so a stale lock never blocks a resume.
  gs://, s3://    a lease object WORKDIR/.lease (grpo_jax/persist/lease.py): renewed while the run lives, taken
                  over once not renewed for `ttl_s` (checkpoint.lease_ttl_s), or at once by a launch on the same
                  host whose holder's pid is gone.

`WorkdirLock(workdir, ttl_s)` holds it for a `with` block; a busy workdir is a WorkdirError naming its holder.
`wait_until_free(workdir, timeout_s)` waits while an earlier holder is alive (the sweep runner's retry after a lost
worker, whose trainer may still be saving and exiting).
"""
from __future__ import annotations

import os
import time

from grpo_jax import errors, storage
from grpo_jax.settings import CheckpointSettings
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.lease import Lease

DEFAULT_TTL_S = CheckpointSettings.lease_ttl_s  # the default of config.checkpoint.lease_ttl_s


class FileLock:
  """An exclusive, non-blocking `flock` on a local file for a `with` block; the file names its holder."""

  def __init__(self, path: str):
    self.path, self._file, self.took_over = path, None, None

  def __enter__(self):
    import fcntl
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    self._file = open(self.path, "a+")
    try:
      fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self._file.seek(0)
      holder = self._file.read().strip() or "another process"
      self._file.close()
      raise errors.WorkdirError(f"workdir {os.path.dirname(self.path)} is in use by {holder}; wait for it to finish "
                                "or use another --workdir") from None
    self._file.seek(0)
    self._file.truncate()
    self._file.write(f"process {os.getpid()} on {os.uname().nodename}\n")
    self._file.flush()
    return self

  def __exit__(self, *exc):
    self._file.close()  # releases the lock

  def is_free(self) -> bool:
    """Whether no process holds the lock now (probed by taking and dropping it)."""
    import fcntl
    if not os.path.exists(self.path):
      return True
    with open(self.path, "a") as f:
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        return False
      fcntl.flock(f, fcntl.LOCK_UN)
      return True


class WorkdirLock:
  """The workdir's lock (module docstring) for a `with` block; a taken-over lease is logged."""

  def __init__(self, workdir: str, ttl_s: float = DEFAULT_TTL_S, log=print):
    files = RunFiles(workdir)
    self._lock = Lease(files.lease, ttl_s) if storage.is_url(workdir) else FileLock(files.lock)
    self._log = log

  def __enter__(self):
    self._lock.__enter__()
    if self._lock.took_over:
      self._log(f"[lease] took over {self._lock.url} ({self._lock.took_over})")
    return self

  def __exit__(self, *exc):
    self._lock.__exit__(*exc)


def wait_until_free(workdir: str, timeout_s: float = 120.0, poll_s: float = 0.5) -> None:
  """Waits, at most `timeout_s`, while a live holder keeps the workdir's lock; the trainer reports a workdir
  still busy after that itself."""
  lock = WorkdirLock(workdir)._lock
  deadline = time.time() + timeout_s
  while not lock.is_free() and time.time() < deadline:
    time.sleep(poll_s)
