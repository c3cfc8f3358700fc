"""Paths that may be object-store URLs: `gs://bucket/dir` and `s3://bucket/dir` work wherever a run's files go
(workdir, sweep directory, compilation cache, model directory), beside plain local paths.

Local paths keep the standard library's behaviour exactly (`os`, `open`); URLs go through `etils.epath`, which
picks fsspec's gcsfs / s3fs backends (TensorFlow's gfile only when TensorFlow is installed), the library orbax
itself uses for its directories. Checkpoint arrays go through TensorStore (grpo_jax/persist/checkpoint.py).

Custom endpoints (emulators, S3-compatible stores) come from the standard variables: `AWS_ENDPOINT_URL` (boto3,
s3fs) and `STORAGE_EMULATOR_HOST` (google-cloud-storage, gcsfs). TensorStore reads neither: `use_endpoints`
passes them on (`TENSORSTORE_GCS_HTTP_URL`; the `endpoint` of its s3 kvstore spec, docs/cloud.md).

An object store has no append and no rename of a directory: writers here replace whole objects, and `move_tree`
copies then deletes. What must be written as a local file first (an appended log, TensorBoard's event files, a
Hugging Face directory) is written into a `LocalCopy` and copied to the store whole (`AppendFile`: a file to
append to). This module is the one that tells a local path from a URL: the rest of the package calls it alike.
"""
from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import time

from grpo_jax import orbax_s3

URL_SCHEMES = ("gs://", "s3://")


def is_url(path) -> bool:
  """Whether `path` names an object in a store (gs:// or s3://) rather than a local file."""
  return isinstance(path, str) and path.startswith(URL_SCHEMES)


def join(base: str, *parts: str) -> str:
  return posixpath.join(base, *parts)  # also a local path's join on the POSIX systems JAX runs on


def absolute(path: str) -> str:
  """A local path made absolute (`~` expanded); a URL as it is, less a trailing slash."""
  return path.rstrip("/") if is_url(path) else os.path.abspath(os.path.expanduser(path))


def basename(path: str) -> str:
  return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(os.path.normpath(path))


# What works the same on a local path and a URL goes through epath, which keeps `os`'s behaviour for local paths.
def _epath(path: str):
  from etils import epath
  return epath.Path(path)


def exists(path: str) -> bool:
  return _epath(path).exists()


def isdir(path: str) -> bool:
  return _epath(path).is_dir()


def listdir(path: str) -> list[str]:
  """Names in a directory ([] when it does not exist)."""
  p = _epath(path)
  return [child.name for child in p.iterdir()] if p.is_dir() else []


def makedirs(path: str) -> None:
  """A local directory and its parents; nothing for a URL (a store has no directories, only key prefixes)."""
  if not is_url(path):
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  """Deletes a file if it exists."""
  _epath(path).unlink(missing_ok=True)


def read_text(path: str) -> str:
  return _epath(path).read_text()


def write_text(path: str, text: str, atomic: bool = False) -> None:
  """Writes `text` whole (an object store replaces the object atomically; a local file too with `atomic`: written
  beside it, then renamed over it, so a kill mid-write, or a reader, sees the old file or none, never half of one)."""
  write_bytes(path, text.encode(), atomic)


def read_bytes(path: str) -> bytes:
  return _epath(path).read_bytes()


def write_bytes(path: str, data: bytes, atomic: bool = False) -> None:
  """As `write_text`; a local file's directory is made first."""
  if not is_url(path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if atomic and not is_url(path):
    _epath(path + ".part").write_bytes(data)
    os.replace(path + ".part", path)
  else:
    _epath(path).write_bytes(data)


def read_tail(path: str, size: int) -> str:
  """The last `size` bytes of a file as text, the first line possibly cut (a store's object is read whole)."""
  if is_url(path):
    return read_text(path)
  with open(path, "rb") as f:
    f.seek(max(os.path.getsize(path) - size, 0))
    return f.read().decode(errors="replace")


def poll_s(path: str) -> float:
  """How often to re-read files under `path` to follow a run: every read of a store is a request."""
  return 10.0 if is_url(path) else 1.0


def copy(src: str, dst: str) -> None:
  """One file from anywhere to anywhere (local, gs://, s3://); between local paths without holding it in memory
  (an exported model's weights)."""
  if not is_url(src) and not is_url(dst):
    shutil.copy(src, dst)
  else:
    write_bytes(dst, read_bytes(src))


def move_tree(src: str, dst: str) -> None:
  """A directory moved: a rename locally; on a store, its objects copied then deleted (a store renames no
  prefix), so a kill midway leaves `src` whole."""
  if not is_url(src):
    shutil.move(src, dst)
    return
  fs, src_key = _fs(src)
  _, dst_key = _fs(dst)
  fs.copy(src_key, dst_key, recursive=True)
  fs.rm(src_key, recursive=True)


class LocalCopy:
  """A local directory for the files of the directory `path`: `path` itself when local; for a store a temporary
  directory whose files `upload` copies there, each whole over its object (a store's objects never grow), as
  leaving a `with` block does (unless by an error) before removing it. `upload=False`: nothing is copied (a
  process other than the one that writes)."""

  def __init__(self, path: str, upload: bool = True):
    self.path, self.remote, self._upload = path, is_url(path), upload
    self.local = tempfile.mkdtemp(prefix="grpo_jax_") if self.remote else path
    os.makedirs(self.local, exist_ok=True)

  def upload(self, names=None) -> None:
    """Copies the local files `names` (default: all) to the store; nothing when `path` is local."""
    if self.remote and self._upload:
      for name in sorted(names or os.listdir(self.local)):
        copy(os.path.join(self.local, name), join(self.path, name))

  def close(self, upload: bool = True) -> None:
    if upload:
      self.upload()
    if self.remote:
      shutil.rmtree(self.local, ignore_errors=True)

  def __enter__(self) -> "LocalCopy":
    return self

  def __exit__(self, error_type, *exc) -> None:
    self.close(upload=error_type is None)


class AppendFile:
  """The text file `path` opened to append to, line-buffered: the file itself when local; on a store (which has no
  append) a local copy holding the object's text, written whole over it by `flush` (at most every `every_s`
  seconds) and `close`. `tell()` and `fileno()` are the local file's (another process may write to it)."""

  def __init__(self, path: str):
    directory, self.name = posixpath.split(path)
    self._dir = LocalCopy(directory or ".")
    local = os.path.join(self._dir.local, self.name)
    if self._dir.remote and exists(path):
      copy(path, local)
    self._file = open(local, "a", buffering=1)
    self._uploaded, self._at = os.path.getsize(local), 0.0  # the size the store holds, and when it was written

  def __getattr__(self, name):  # write, writelines, tell, fileno
    return getattr(self._file, name)

  def flush(self, every_s: float = 0.0) -> None:
    self._file.flush()
    size = os.path.getsize(self._file.name)
    if size != self._uploaded and time.time() - self._at >= every_s:
      self._dir.upload([self.name])
      self._uploaded, self._at = size, time.time()

  def close(self) -> None:
    self.flush()
    self._file.close()
    self._dir.close(upload=False)

  def __enter__(self) -> "AppendFile":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


MODEL_CACHE = "~/.cache/grpo_jax/models"  # GRPO_JAX_MODEL_CACHE overrides it


def local_dir(path: str) -> str:
  """`path` itself when local; for a store directory (a Hugging Face model on gs:// or s3://) a local mirror of
  it under GRPO_JAX_MODEL_CACHE (default ~/.cache/grpo_jax/models/<scheme>/<bucket>/<key>), downloaded once:
  files whose size already matches are not fetched again. safetensors and tokenizers read local files only."""
  if not is_url(path):
    return path
  fs, key = _fs(path)
  scheme = path.split("://", 1)[0]
  root = os.path.expanduser(os.environ.get("GRPO_JAX_MODEL_CACHE", MODEL_CACHE))
  local = os.path.join(root, scheme, key.rstrip("/"))
  for remote, info in fs.find(key, detail=True).items():
    dst = os.path.join(local, os.path.relpath(remote, key.rstrip("/")))
    if os.path.exists(dst) and os.path.getsize(dst) == info["size"]:
      continue
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fs.get_file(remote, dst + ".part")
    os.replace(dst + ".part", dst)  # a download cut short never passes for a file
  return local


def _fs(url: str):
  """(fsspec filesystem, path without the scheme) of a URL."""
  import fsspec
  return fsspec.core.url_to_fs(url)


def orbax_options(directory: str) -> dict:
  """orbax CheckpointManagerOptions for `directory`: none locally; on a store, TensorStore pointed at the
  endpoints of the standard variables (`use_endpoints`), and checkpoints committed by a commit_success.txt object
  written last (what orbax does on gs:// already), not by renaming a temporary directory, which a store can only
  copy object by object."""
  if not is_url(directory):
    return {}
  import orbax.checkpoint as ocp
  use_endpoints()
  return {"atomicity_options": ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)}


_TS_GCS_URL = "TENSORSTORE_GCS_HTTP_URL"


def use_endpoints() -> None:
  """Points TensorStore (orbax's array I/O) at the endpoints the other clients read from the standard
  variables: `STORAGE_EMULATOR_HOST` -> `TENSORSTORE_GCS_HTTP_URL` (unless set), and s3:// checkpoint paths to
  TensorStore's s3 driver with `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` as its endpoint. Idempotent."""
  emulator = os.environ.get("STORAGE_EMULATOR_HOST")
  if emulator and _TS_GCS_URL not in os.environ:
    os.environ[_TS_GCS_URL] = emulator if "://" in emulator else "http://" + emulator
  orbax_s3.teach_orbax_s3()
