"""One run per workdir on an object store: a lease object taken with the store's conditional write.

A store has no `flock`, and nothing drops a lock when its holder dies, so the lock is a lease: WORKDIR/.lease
holds the holder's host, pid, a random token and the time it was last renewed. It is created only if absent
(S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`) and replaced only if unchanged since it was read (S3
`If-Match: <etag>`, GCS `ifGenerationMatch=<generation>`), so of two launches racing for it exactly one wins.
A daemon thread renews it every ttl/3. Another launch takes it over when it is stale (not renewed within
`ttl_s`; judged by the launcher's clock against the holder's, so clocks must agree to well within the ttl,
as NTP keeps them), or at once when its holder ran on this host and its pid is gone (a killed run started
again). Otherwise the launch is refused with one line.

A holder that finds its lease replaced (it stalled past the ttl and another run took over) ends its process at
once, saving nothing (exit code 2): two runs must not write one workdir.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Callable

from grpo_jax import errors


class Conflict(Exception):
  """The object changed since it was read (a conditional write's precondition failed)."""


class _S3:
  """The lease object through boto3 (`AWS_ENDPOINT_URL` points it at an emulator or another S3 store)."""

  def __init__(self, bucket: str, key: str):
    import boto3
    self.client, self.bucket, self.key = boto3.client("s3"), bucket, key

  def read(self) -> tuple[bytes, str] | None:
    try:
      r = self.client.get_object(Bucket=self.bucket, Key=self.key)
    except self.client.exceptions.NoSuchKey:
      return None
    return r["Body"].read(), r["ETag"]

  def write(self, data: bytes, version: str | None) -> str:
    """Creates the object (version None) or replaces `version` of it; Conflict if that is not the state."""
    cond = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
    try:
      return self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data, **cond)["ETag"]
    except self.client.exceptions.ClientError as e:
      if e.response["Error"]["Code"] in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
        raise Conflict() from None
      raise

  def delete(self, version: str) -> None:
    # S3's conditional delete is recent and not everywhere: read-compare-delete, the release's race is benign
    # (a run that took over a lease its holder is releasing writes it again within ttl/3).
    current = self.read()
    if current is not None and current[1] == version:
      self.client.delete_object(Bucket=self.bucket, Key=self.key)


class _GCS:
  """The lease object through google-cloud-storage (`STORAGE_EMULATOR_HOST` points it at an emulator)."""

  def __init__(self, bucket: str, key: str):
    from google.cloud import storage
    from google.api_core import exceptions
    if os.environ.get("STORAGE_EMULATOR_HOST"):
      from google.auth.credentials import AnonymousCredentials
      client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator"),
                              credentials=AnonymousCredentials())
    else:
      client = storage.Client()
    self.bucket, self.key, self._exceptions = client.bucket(bucket), key, exceptions

  def read(self) -> tuple[bytes, str] | None:
    blob = self.bucket.get_blob(self.key)
    if blob is None:
      return None
    try:
      return blob.download_as_bytes(if_generation_match=blob.generation), str(blob.generation)
    except (self._exceptions.NotFound, self._exceptions.PreconditionFailed):
      return self.read()  # replaced or deleted between the two calls

  def write(self, data: bytes, version: str | None) -> str:
    blob = self.bucket.blob(self.key)
    try:
      blob.upload_from_string(data, if_generation_match=0 if version is None else int(version))
    except self._exceptions.PreconditionFailed:
      raise Conflict() from None
    return str(blob.generation)

  def delete(self, version: str) -> None:
    current = self.read()  # fake-gcs-server ignores the precondition on deletes: compared here too
    if current is not None and current[1] == version:
      with contextlib.suppress(self._exceptions.NotFound, self._exceptions.PreconditionFailed):
        self.bucket.blob(self.key).delete(if_generation_match=int(version))


def store_for(url: str):
  """The conditional-write client of `url`'s store (gs:// or s3://)."""
  scheme, _, rest = url.partition("://")
  bucket, _, key = rest.partition("/")
  return {"s3": _S3, "gs": _GCS}[scheme](bucket, key)


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Lease:
  """The lease on `url` (WORKDIR/.lease) while the `with` block runs; `ttl_s` seconds without renewal make it
  stale. `on_lost` is called (from the renewing thread) if another run took it over: by default the process
  ends at once (exit code 2), saving nothing: the workdir is the other run's now. (Interrupting the main thread
  would look like Ctrl-C, whose handler saves a checkpoint: grpo_jax/persist/preemption.py.)"""

  def __init__(self, url: str, ttl_s: float, *, clock: Callable[[], float] = time.time,
               on_lost: Callable[[], None] | None = None):
    self.url, self.ttl_s, self.clock = url, float(ttl_s), clock
    self.token = uuid.uuid4().hex
    self.host, self.pid = socket.gethostname(), os.getpid()
    self._store = store_for(url)
    self._version: str | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._on_lost = on_lost or self._interrupt
    self.lost = False

  def _body(self) -> bytes:
    return json.dumps({"host": self.host, "pid": self.pid, "token": self.token, "renewed_at": self.clock(),
                       "ttl_s": self.ttl_s}).encode()

  def _takeable(self, holder: dict) -> str | None:
    """Why the lease `holder` wrote may be taken over (None: it may not)."""
    age = self.clock() - float(holder.get("renewed_at", 0))
    if age > float(holder.get("ttl_s", self.ttl_s)):
      return f"stale: not renewed for {age:.0f}s"
    if holder.get("host") == self.host and not _pid_alive(int(holder.get("pid", -1))):
      return f"its holder, process {holder.get('pid')} on this host, is gone"
    return None

  def acquire(self) -> str | None:
    """Takes the lease; returns why an earlier holder's was taken over (None: there was none). WorkdirError
    when a live run holds it."""
    for _ in range(10):  # each retry follows another launch's write in between: a few at most
      current = self._store.read()
      reason = None
      if current is not None:
        try:
          holder = json.loads(current[0])
        except ValueError:
          holder = {}  # a damaged lease object counts as stale
        reason = self._takeable(holder) if holder else "unreadable"
        if reason is None:
          raise errors.WorkdirError(
              f"workdir {self.url.rsplit('/', 1)[0]} is in use by process {holder.get('pid')} on "
              f"{holder.get('host')} (lease renewed {self.clock() - float(holder['renewed_at']):.0f}s ago, stale "
              f"after {holder.get('ttl_s', self.ttl_s):.0f}s); wait for it to finish or use another --workdir")
      try:
        self._version = self._store.write(self._body(), None if current is None else current[1])
        return reason
      except Conflict:
        continue
    raise errors.WorkdirError(f"workdir {self.url.rsplit('/', 1)[0]}: its lease kept changing while this launch "
                              "tried to take it; another launch is racing for it: use one --workdir per run")

  def renew(self) -> bool:
    """Writes a fresh renewal time if the lease is still ours; False (and `lost`) if another run replaced it."""
    try:
      self._version = self._store.write(self._body(), self._version)
      return True
    except Conflict:
      self.lost = True
      return False

  def _renew_loop(self):
    while not self._stop.wait(self.ttl_s / 3):
      try:
        ok = self.renew()
      except Exception as e:  # a store hiccup: the next renewal tries again, within the ttl
        print(f"[lease] renewing {self.url} failed ({type(e).__name__}: {e}); retrying", file=sys.stderr)
        continue
      if not ok:
        print(f"[lease] {self.url} was taken over by another run; stopping this one", file=sys.stderr, flush=True)
        self._on_lost()
        return

  @staticmethod
  def _interrupt():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(errors.EXIT_USER_ERROR)

  def release(self):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._version is not None and not self.lost:
      self._store.delete(self._version)
    self._version = None

  def __enter__(self):
    self.took_over = self.acquire()
    self._thread = threading.Thread(target=self._renew_loop, name="grpo-lease", daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self.release()

  def is_free(self) -> bool:
    """Whether a launch could take the lease now: none, unreadable, stale or its holder gone (`ttl_s`: the
    staleness of a lease that does not state its own)."""
    current = self._store.read()
    try:
      return current is None or self._takeable(json.loads(current[0])) is not None
    except ValueError:
      return True
