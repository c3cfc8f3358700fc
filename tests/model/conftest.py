"""Session fixtures for the model tests (helpers live in helpers.py)."""
from __future__ import annotations

import pytest

from .helpers import SPECS, build_torch_model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
  """name -> (checkpoint directory, torch model in eval mode)."""
  out = {}
  for name, (_, _, save_kw) in SPECS.items():
    model = build_torch_model(name)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path, **save_kw)
    out[name] = (path, model)
  return out
