"""A run's per-prompt evaluation rows: written whole or not at all, found again by step."""
import json
import os

import pytest

from grpo_jax.train import evaluation, metrics


def test_rows_are_replaced_atomically_and_listed_by_step(tmp_path, monkeypatch):
  workdir = str(tmp_path)
  os.makedirs(os.path.join(workdir, metrics.EVAL_ROWS_DIR))
  first = [{"prompt": "1+1=", "greedy": {"reward": 1.0}}]
  evaluation.write_rows(metrics.eval_rows_path(workdir, 10), first)
  evaluation.write_rows(metrics.eval_rows_path(workdir, 2), first)
  assert metrics.eval_row_steps(workdir) == [2, 10]

  def killed(src, dst):  # the process dies between writing the new rows and renaming them over the old
    raise KeyboardInterrupt
  monkeypatch.setattr(os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    evaluation.write_rows(metrics.eval_rows_path(workdir, 10), first * 50)
  with open(metrics.eval_rows_path(workdir, 10)) as f:
    assert [json.loads(line) for line in f] == first  # the old rows, whole
  assert metrics.eval_row_steps(workdir) == [2, 10]  # the leftover .part is not a step
