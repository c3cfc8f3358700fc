"""Paths that may be object-store URLs: `gs://bucket/dir` and `s3://bucket/dir` work wherever a run's files go
(workdir, sweep directory, compilation cache, model directory), beside plain local paths.

Local paths keep the standard library's behaviour exactly (`os`, `open`); URLs go through `etils.epath`, which
picks fsspec's gcsfs / s3fs backends (TensorFlow's gfile only when TensorFlow is installed), the library orbax
itself uses for its directories. Checkpoint arrays go through TensorStore (grpo_jax/train/checkpoint.py).

Custom endpoints (emulators, S3-compatible stores) come from the standard variables: `AWS_ENDPOINT_URL` (boto3,
s3fs) and `STORAGE_EMULATOR_HOST` (google-cloud-storage, gcsfs). TensorStore reads neither: `use_endpoints`
passes them on (`TENSORSTORE_GCS_HTTP_URL`; the `endpoint` of its s3 kvstore spec, docs/cloud.md).

An object store has no append and no rename of a directory: writers here replace whole objects (metrics rows are
kept in memory and rewritten at each flush, grpo_jax/train/metrics.py), and `move_tree` copies then deletes.
"""
from __future__ import annotations

import os
import posixpath
import shutil

from grpo_jax import orbax_s3

URL_SCHEMES = ("gs://", "s3://")


def is_url(path) -> bool:
  """Whether `path` names an object in a store (gs:// or s3://) rather than a local file."""
  return isinstance(path, str) and path.startswith(URL_SCHEMES)


def join(base: str, *parts: str) -> str:
  return posixpath.join(base, *parts)  # also a local path's join on the POSIX systems JAX runs on


def absolute(path: str) -> str:
  """A local path made absolute; a URL as it is, less a trailing slash."""
  return path.rstrip("/") if is_url(path) else os.path.abspath(path)


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


def rmtree(path: str) -> None:
  p = _epath(path)
  if p.exists():
    p.rmtree()


def read_text(path: str) -> str:
  return _epath(path).read_text()


def write_text(path: str, text: str, atomic: bool = False) -> None:
  """Writes `text` whole (an object store replaces the object atomically; a local file too with `atomic`: written
  beside it, then renamed over it, so a kill mid-write, or a reader, sees the old file or none, never half of one)."""
  write_bytes(path, text.encode(), atomic)


def read_bytes(path: str) -> bytes:
  return _epath(path).read_bytes()


def write_bytes(path: str, data: bytes, atomic: bool = False) -> None:
  """As `write_text`."""
  if atomic and not is_url(path):
    _epath(path + ".part").write_bytes(data)
    os.replace(path + ".part", path)
  else:
    _epath(path).write_bytes(data)


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


_TS_GCS_URL = "TENSORSTORE_GCS_HTTP_URL"


def use_endpoints() -> None:
  """Points TensorStore (orbax's array I/O) at the endpoints the other clients read from the standard
  variables: `STORAGE_EMULATOR_HOST` -> `TENSORSTORE_GCS_HTTP_URL` (unless set), and s3:// checkpoint paths to
  TensorStore's s3 driver with `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` as its endpoint. Idempotent."""
  emulator = os.environ.get("STORAGE_EMULATOR_HOST")
  if emulator and _TS_GCS_URL not in os.environ:
    os.environ[_TS_GCS_URL] = emulator if "://" in emulator else "http://" + emulator
  orbax_s3.teach_orbax_s3()
