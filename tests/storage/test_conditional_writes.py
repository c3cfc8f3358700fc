"""The emulators honour the conditional writes the workdir lease is built on (grpo_jax/persist/lease.py): create
only if absent, replace only the version that was read. Without them two launches could both take a lease."""
from __future__ import annotations

import pytest

from grpo_jax.persist import lease as lease_lib


def _check_conditional_writes(url: str) -> None:
  store = lease_lib.store_for(url)
  assert store.read() is None
  v1 = store.write(b"first", None)
  with pytest.raises(lease_lib.Conflict):  # a second create of the same object
    store.write(b"second", None)
  v2 = store.write(b"third", v1)           # a replace of the version read
  assert store.read() == (b"third", v2)
  with pytest.raises(lease_lib.Conflict):  # a replace of a version that is no longer there
    store.write(b"fourth", v1)
  assert store.read() == (b"third", v2)
  store.delete(v1)                          # a stale version deletes nothing
  assert store.read() is not None
  store.delete(v2)
  assert store.read() is None


def test_the_emulator_honours_create_if_absent_and_replace_if_unchanged(store):
  _check_conditional_writes(store.url("cw") + "/.lease")


def test_gcp_storage_emulator_ignores_preconditions(gcp_storage_emulator, monkeypatch):
  # Why GCS runs on fake-gcs-server: this emulator accepts every conditional write (strict: when it learns
  # ifGenerationMatch, this test fails and may switch emulators).
  for k, v in gcp_storage_emulator.env.items():
    monkeypatch.setenv(k, v)
  with pytest.raises(pytest.fail.Exception):
    try:
      _check_conditional_writes(gcp_storage_emulator.url("cw") + "/.lease")
    except AssertionError as e:
      pytest.fail(str(e))
