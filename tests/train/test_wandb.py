"""`log.wandb`: the run's scalars and sample tables go to Weights & Biases too (offline mode here: nothing is sent)."""
from __future__ import annotations

import glob
import json
import os

import pytest

from grpo_jax.train import loop
from grpo_jax.persist.metrics import read_jsonl
from tests.train.conftest import load_experiment

wandb = pytest.importorskip("wandb", reason="wandb is in the test extra: pip install -e '.[test]'")


def test_offline_wandb_gets_every_logged_scalar_and_the_samples(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_SILENT", "true")
  logged = []
  real_log = wandb.Run.log

  def recording_log(run, data, step=None, **kwargs):
    logged.append((step, dict(data)))
    return real_log(run, data, step=step, **kwargs)

  monkeypatch.setattr(wandb.Run, "log", recording_log)
  config = load_experiment("default")("test")
  config.num_steps = 3
  config.log.wandb, config.log.wandb_mode = True, "offline"
  config.log.samples_every, config.log.plot = 1, False
  workdir = str(tmp_path / "run")
  loop.train(config, workdir)

  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  scalars = [(step, data) for step, data in logged if "samples" not in data]
  assert scalars == [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in records]
  # The W&B run is this run (its id), written under WORKDIR/wandb, with a table of samples per logged step.
  run_id = open(os.path.join(workdir, "run_id")).read().strip()
  (run_dir,) = glob.glob(os.path.join(workdir, "wandb", f"offline-run-*-{run_id}"))
  tables = sorted(glob.glob(os.path.join(run_dir, "files", "media", "table", "samples_*.table.json")))
  assert len(tables) == config.num_steps
  samples = read_jsonl(os.path.join(workdir, "samples.jsonl"))
  with open(tables[-1]) as f:
    table = json.load(f)
  assert table["columns"] == ["step", "prompt", "completion", "reward"]
  assert [row[2] for row in table["data"]] == [s["completion"] for s in samples if s["step"] == table["data"][0][0]]
