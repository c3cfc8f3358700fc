"""grpo_jax/orbax_s3.py names the orbax version it was written for: a line when another is installed, one line
and a stop when the private functions it replaces are gone. (The patch itself: tests/storage/ on a real S3.)"""
import importlib.metadata

import pytest

from grpo_jax import orbax_s3


@pytest.fixture
def unpatched(monkeypatch):
  from orbax.checkpoint._src.path import gcs_utils
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
  monkeypatch.setattr(orbax_s3, "_PATCHED", False)
  for module, name in ((ts_utils, "_normalize_path"), (ts_utils, "_use_gcs_driver"),
                       (gcs_utils, "get_kvstore_for_gcs")):
    monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
  return ts_utils


def test_the_installed_orbax_is_the_one_the_patch_was_written_for():
  assert importlib.metadata.version("orbax-checkpoint").startswith(orbax_s3.WRITTEN_FOR + ".")


def test_another_orbax_version_is_named_in_one_line(unpatched, monkeypatch, capsys):
  monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.13.2")
  orbax_s3.teach_orbax_s3()
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "written for orbax-checkpoint 0.12.x, this is 0.13.2" in err
  assert unpatched._use_gcs_driver("s3://bucket/run") and not unpatched._use_gcs_driver("/tmp/run")
  assert unpatched._normalize_path("s3://bucket//run/./x") == "s3://bucket/run/x"


def test_missing_private_functions_stop_with_one_line(unpatched, monkeypatch):
  monkeypatch.delattr(unpatched, "_use_gcs_driver")
  with pytest.raises(RuntimeError, match=r"lacks what grpo_jax/orbax_s3.py replaces .* need orbax-checkpoint 0.12.x"):
    orbax_s3.teach_orbax_s3()
