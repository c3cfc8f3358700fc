"""s3:// checkpoints through orbax-checkpoint, which knows gs:// and local paths only.

orbax-checkpoint 0.12 sends gs:// paths to TensorStore's gcs driver and every other path to its file driver, so
s3://b/x would become a relative file path. `teach_orbax_s3` replaces three of its private functions (the driver
choice, the gcs kvstore spec builder and the path normalization) by versions that also take s3:// to TensorStore's
s3 driver; gs:// and local paths go through the originals. Private functions change without notice: the patch
names the orbax version it was written for, says so in one line when another one is installed, and stops with
one line when the functions it replaces are gone (tests/storage/ run it against a real S3 server).
"""
from __future__ import annotations

import importlib.metadata
import os
import sys

WRITTEN_FOR = "0.12"  # orbax-checkpoint's major.minor whose private functions this patch replaces
_PATCHED = False


def s3_kvstore_spec(url: str) -> dict:
  """TensorStore's kvstore spec of an s3:// URL, with the endpoint and region of the standard variables."""
  bucket, _, key = url[len("s3://"):].partition("/")
  spec = {"driver": "s3", "bucket": bucket, "path": key}
  endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
  if endpoint:
    spec["endpoint"] = endpoint
  region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
  if region:
    spec["aws_region"] = region
  return spec


def teach_orbax_s3() -> None:
  """Makes orbax write and read s3:// checkpoints through TensorStore's s3 driver. Idempotent."""
  global _PATCHED
  if _PATCHED:
    return
  version = importlib.metadata.version("orbax-checkpoint")
  if ".".join(version.split(".")[:2]) != WRITTEN_FOR:
    print(f"[storage] grpo_jax/orbax_s3.py was written for orbax-checkpoint {WRITTEN_FOR}.x, this is {version}: "
          "s3:// checkpoints are untested with it (gs:// and local ones are not affected)", file=sys.stderr)
  try:
    from orbax.checkpoint._src.path import gcs_utils
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
    gcs_driver, gcs_spec = ts_utils._use_gcs_driver, gcs_utils.get_kvstore_for_gcs
    normalize = ts_utils._normalize_path
  except (ImportError, AttributeError) as e:
    raise RuntimeError(f"orbax-checkpoint {version} lacks what grpo_jax/orbax_s3.py replaces ({e}): s3:// "
                       f"checkpoints need orbax-checkpoint {WRITTEN_FOR}.x (constraints.txt)") from None

  def use_store_driver(directory: str) -> bool:
    return directory.startswith("s3://") or gcs_driver(directory)

  def kvstore_for_store(path: str) -> dict:
    return s3_kvstore_spec(path) if str(path).startswith("s3://") else gcs_spec(path)

  def normalize_path(path: str) -> str:  # os.path.normpath would make s3://b/x s3:/b/x
    return "s3://" + os.path.normpath(path[len("s3://"):]) if str(path).startswith("s3://") else normalize(path)

  ts_utils._normalize_path = normalize_path
  ts_utils._use_gcs_driver = use_store_driver
  gcs_utils.get_kvstore_for_gcs = kvstore_for_store
  _PATCHED = True
