"""Preemption: SIGTERM or SIGINT ends a run at its next safe point with the last completed step saved.

Spot and preemptible VMs are reclaimed with a SIGTERM 30 s (GCP) to 2 min (AWS) ahead; Kubernetes sends it to
the pod before `terminationGracePeriodSeconds` runs out; Ctrl-C is a SIGINT. `Preemption` turns each into the
same path (grpo_jax/train/loop.py):

- Before the run has a state worth saving (loading, the warm start, the step-0 evaluation) and after the last
  step is saved (the final export), nothing is lost by stopping at once: the handler raises `Preempted` where
  the main thread is.
- While steps run (`deferred()`), the handler only records the request. The loop looks at it before each
  rollout and again before each update: a rollout in flight is dropped (the update has not yet consumed the
  parameters it donates, so the state of the last completed step is intact), that state is saved unless it
  already is, and the run ends. A signal that lands during an update lets it finish; its step is saved. A
  checkpoint being written (in the background) is waited for.
- A rollout can outlast the notice (SmolLM2's sampling on a 2-core CPU takes minutes), and Python runs a signal
  handler only when the main thread comes back from XLA. So the signal also wakes a thread
  (`signal.set_wakeup_fd`) that records the request at once and sets the events the loop asked to hear it on
  (`notify`): the loop's own thread then saves the last completed state beside the sampler
  (`Workdir.save_on_request`, grpo_jax/persist/workdir.py). What is saved, and when, is the loop's.
- A watchdog thread ends the process `deadline_s` after the signal if it is still alive (an update longer than
  the deadline: on a slow machine, raise the deadline where the cloud allows, or checkpoint more often), with
  whatever checkpoints are committed by then: orbax writes each into a temporary directory first.

With several processes (jax.distributed) the request is a collective at those two points: every process
learns that one of them was signalled at the same point and all save the same step (no rescue thread: a save
is collective). JAX's own preemption sync
point (`multihost_utils.reached_preemption_sync_point`) hears only SIGTERM, through a C++ handler that takes
SIGTERM from Python, and agrees on the step after the latest one any process reached: one more whole step
inside the notice. A one-word all-gather per check costs microseconds.

`notice` polls a cloud's early warning and takes the same path: "gce" (the `preempted` metadata key of a GCE
spot or preemptible VM) or "aws" (the two-minute `spot/instance-action` notice in EC2 instance metadata).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

from grpo_jax import errors, signals

NOTICES = ("", "gce", "aws")
NOTICE_POLL_S = 5.0


class Preemption:
  """Context manager: catches SIGTERM and SIGINT in the main thread (elsewhere, a notebook's worker thread for
  instance, only the cloud notice and `request` work) and restores the previous handlers on exit.

  Args:
    deadline_s: seconds from the first request to the process's exit at the latest (the watchdog).
    log: prints one line (the trainer's console: train.log in a sweep).
    collective: with several JAX processes, their AND of a flag (train/distributed.py's all_true), through
      which `stop_requested` asks every process; None with one.
    notice: "" (none), "gce" or "aws": a thread polls the cloud's metadata server for an early warning.
  """

  def __init__(self, deadline_s: float, log: Callable[[str], None] = print, *,
               collective: Callable[[bool], bool] | None = None, notice: str = ""):
    if notice not in NOTICES:
      raise errors.ConfigError(f"checkpoint.preemption_notice={notice!r} is not one of {list(NOTICES)}")
    self.deadline_s = float(deadline_s)
    self.log = log
    self.collective = collective
    self.notice = notice
    self.reason: str | None = None        # what asked to stop: "SIGTERM", "SIGINT", "gce notice", ...
    self._sigints = 0
    self.requested_at: float | None = None
    self._immediate = True
    self._previous = {}
    self._closed = threading.Event()
    self._lock = threading.Lock()
    self._listeners: list[threading.Event] = []  # set on the first request (`notify`)
    self._wakeup: tuple[int, int, int] | None = None  # (read end, write end, the previous wakeup fd)

  # -- installing and removing ---------------------------------------------------------------------------------
  def __enter__(self) -> "Preemption":
    self.install()
    if self.notice:
      threading.Thread(target=self._watch_notice, name="preemption-notice", daemon=True).start()
    return self

  def install(self) -> None:
    """(Re)installs the handlers: jax.distributed.initialize puts JAX's own SIGTERM handler (its preemption
    notifier) in place of Python's, so the trainer calls this again after it."""
    if threading.current_thread() is not threading.main_thread():
      return
    for sig, previous in signals.install(self._on_signal).items():
      self._previous.setdefault(sig, previous)
    if self._wakeup is None:
      read, write = os.pipe()
      os.set_blocking(write, False)
      self._wakeup = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
      self._wakeup_thread = threading.Thread(target=self._watch_wakeup, args=(read,), name="preemption-wakeup",
                                             daemon=True)
      self._wakeup_thread.start()

  def __exit__(self, *exc) -> None:
    self._closed.set()
    signals.restore(self._previous)
    self._previous.clear()
    if self._wakeup is not None:
      read, write, previous = self._wakeup
      signal.set_wakeup_fd(previous)
      os.close(write)  # the wakeup thread sees the end of the pipe and closes the read end
      self._wakeup = None
      if self._wakeup_thread is not threading.current_thread():
        self._wakeup_thread.join(5.0)  # a run leaves no thread behind

  # -- requests ---------------------------------------------------------------------------------------------------
  def _on_signal(self, signum, frame) -> None:
    if signum == signal.SIGINT:
      self._sigints += 1
      if self._sigints > 1:
        raise KeyboardInterrupt  # a second Ctrl-C: stop now, whatever is in flight
    self.request(signal.Signals(signum).name)

  def request(self, reason: str) -> None:
    """Asks the run to stop (a signal, a cloud notice) and sets the events given to `notify`. Raises `Preempted`
    outside `deferred()` when called in the main thread (a signal handler runs there)."""
    with self._lock:
      first = self.reason is None
      if first:
        self.reason, self.requested_at = reason, time.monotonic()
      listeners = list(self._listeners)
    if first:
      self.log(f"[preempted] {reason}: stopping at the next safe point (deadline {self.deadline_s:.0f} s)")
      threading.Thread(target=self._watchdog, name="preemption-deadline", daemon=True).start()
    for event in listeners:
      event.set()
    if self._immediate and threading.current_thread() is threading.main_thread():
      raise errors.Preempted(self.reason)

  def notify(self, event: threading.Event) -> None:
    """Sets `event` on a request, from whichever thread hears it first (at once when one was made already),
    until `forget(event)`."""
    with self._lock:
      self._listeners.append(event)
      if self.reason is not None:
        event.set()

  def forget(self, event: threading.Event) -> None:
    with self._lock:
      self._listeners.remove(event)

  @contextlib.contextmanager
  def deferred(self):
    """Within it a request is only recorded; `stop_requested` reads it at the loop's safe points."""
    self._immediate = False
    try:
      yield self
    finally:
      self._immediate = True

  def stop_requested(self) -> bool:
    """Whether to stop now. A collective with several processes: every process must call it at the same points,
    and all get the same answer."""
    local = self.reason is not None
    return not self.collective(not local) if self.collective else local

  def seconds_since_request(self) -> float:
    return 0.0 if self.requested_at is None else time.monotonic() - self.requested_at

  # -- threads ----------------------------------------------------------------------------------------------------
  def _watch_wakeup(self, read: int) -> None:
    """The C-level signal handler writes the signal's number here at once, even while the main thread waits
    in XLA: the request (and a rescue) need not wait for the Python handler."""
    try:
      while True:
        data = os.read(read, 64)
        if not data:  # __exit__ closed the write end
          return
        for signum in data:
          if signum in [int(sig) for sig in signals.STOP] and not self._closed.is_set():
            self.request(signal.Signals(signum).name)
    finally:
      os.close(read)

  def _watchdog(self) -> None:
    if self._closed.wait(self.deadline_s):
      return
    self.log(f"[preempted] still running {self.deadline_s:.0f} s after {self.reason} (checkpoint."
             "preemption_deadline_s): exiting now; the run resumes from its last committed checkpoint")
    exit_preempted()

  def _watch_notice(self) -> None:
    poll = {"gce": gce_preempted, "aws": aws_instance_action}[self.notice]
    while not self._closed.wait(NOTICE_POLL_S):
      try:
        notice = poll()
      except OSError:  # the metadata server not reachable (not on that cloud, a network blip): try again
        continue
      if notice:
        if self.reason is None:
          self.request(f"{self.notice} notice ({notice})")
        return


def exit_preempted(*, tell_coordinator: bool = False) -> None:
  """Ends the process with EXIT_PREEMPTED, its output flushed, without the interpreter's teardown.

  A signal handled while XLA compiles (the first seconds of a run: loading, the warm start) raises `Preempted`
  in the main thread, but the compile goes on in XLA's thread pool. A normal exit (sys.exit) then destroys the
  PJRT client (the interpreter's last garbage collection, or JAX's atexit `clean_up`) while that compile still
  uses it: a segmentation fault, exit code 139 instead of 75, in 5 of 17 SIGTERMs early in the default run.
  Nothing is lost by skipping the teardown: the loop has closed its files and committed its checkpoints before
  `Preempted` leaves it. `tell_coordinator` (the main thread's exit, not the watchdog's: a stuck process cannot
  meet the others) disconnects from the multi-process coordinator first, as JAX's atexit would have.
  """
  jax_distributed = sys.modules.get("jax.distributed")
  if tell_coordinator and jax_distributed is not None:
    jax_distributed.shutdown()  # a no-op with one process
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(errors.EXIT_PREEMPTED)


# -- the clouds' early warnings ---------------------------------------------------------------------------------
def _get(url: str, headers: dict[str, str], timeout_s: float = 2.0) -> str | None:
  """The body of GET `url`, or None on 404 (no notice)."""
  try:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
      return response.read().decode()
  except urllib.error.HTTPError as e:
    if e.code == 404:
      return None
    raise OSError(f"{url}: HTTP {e.code}") from e


def gce_preempted() -> str | None:
  """"TRUE" once Compute Engine has begun to preempt this VM (metadata key instance/preempted), else None.
  GCE_METADATA_HOST overrides the server (google-auth reads the same variable)."""
  host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
  value = _get(f"http://{host}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"})
  return "preempted=TRUE" if value is not None and value.strip().upper() == "TRUE" else None


def aws_instance_action() -> str | None:
  """The action and time of an EC2 spot interruption notice (spot/instance-action, there two minutes ahead),
  else None. IMDSv2: a session token first. AWS_EC2_METADATA_SERVICE_ENDPOINT overrides the server (botocore
  reads the same variable)."""
  base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254").rstrip("/")
  request = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                   headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
  with urllib.request.urlopen(request, timeout=2.0) as response:
    token = response.read().decode()
  body = _get(f"{base}/latest/meta-data/spot/instance-action", {"X-aws-ec2-metadata-token": token})
  if body is None:
    return None
  try:
    action = json.loads(body)
    return f"{action.get('action', 'stop')} at {action.get('time', '?')}"
  except json.JSONDecodeError:
    return body.strip()[:100]
