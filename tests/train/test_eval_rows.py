"""A run's per-prompt evaluation rows: written whole or not at all, found again by step."""
import json
import os

import pytest

from grpo_jax.train import evaluation
from grpo_jax.persist.layout import RunFiles


def test_rows_are_replaced_atomically_and_listed_by_step(tmp_path, monkeypatch):
  files = RunFiles(str(tmp_path))
  first = [{"prompt": "1+1=", "greedy": {"reward": 1.0}}]
  evaluation.write_rows(files.eval_rows(10), first)
  evaluation.write_rows(files.eval_rows(2), first)
  assert files.eval_row_steps() == [2, 10]

  def killed(src, dst):  # the process dies between writing the new rows and renaming them over the old
    raise KeyboardInterrupt
  monkeypatch.setattr(os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    evaluation.write_rows(files.eval_rows(10), first * 50)
  with open(files.eval_rows(10)) as f:
    assert [json.loads(line) for line in f] == first  # the old rows, whole
  assert files.eval_row_steps() == [2, 10]  # the leftover .part is not a step
