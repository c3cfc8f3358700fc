"""metrics.jsonl / samples.jsonl bookkeeping across a resume, and the learning-rate schedule."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from grpo_jax.persist.metrics import MetricsWriter, read_jsonl
from grpo_jax import config as config_lib
from grpo_jax.settings import OptimSettings, Settings
from grpo_jax.train.optim import learning_rate_schedule


def test_resume_drops_records_after_the_checkpoint(tmp_path):
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  for step in range(5):
    w.write(step, {"reward": np.float32(step) / 10, "bad": float("nan")})
    w.write_samples(step, [{"prompt": "1+1=", "completion": "2", "reward": 1.0}])
  w.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 5, "rew')  # killed mid-line
  assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [0, 1, 2, 3, 4]
  assert read_jsonl(str(tmp_path / "metrics.jsonl"))[2] == {"step": 2, "reward": pytest.approx(0.2), "bad": None}

  w = MetricsWriter(str(tmp_path), tensorboard=False, resume_step=2)
  assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [0, 1, 2]
  assert [r["step"] for r in read_jsonl(str(tmp_path / "samples.jsonl"))] == [0, 1, 2]
  w.write(3, {"reward": 0.5})
  assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [0, 1, 2, 3]
  w.close()
  MetricsWriter(str(tmp_path), tensorboard=False).close()  # a fresh run starts empty files
  assert read_jsonl(str(tmp_path / "metrics.jsonl")) == read_jsonl(str(tmp_path / "samples.jsonl")) == []


def _optim(**kw):
  return OptimSettings(**{"learning_rate": 1e-3, **kw})


def test_schedule_warmup_then_cosine_in_updates():
  # 10 steps of 2 updates each, warmup over 2 steps (4 updates), cosine to 10% of the peak over 16 updates.
  sched = learning_rate_schedule(_optim(schedule="cosine", warmup_steps=2, min_lr_ratio=0.1), 10, 2)
  assert float(sched(0)) == 0.0
  assert float(sched(2)) == pytest.approx(0.5e-3)
  assert float(sched(4)) == pytest.approx(1e-3)
  k = 8
  expected = 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (k - 4) / 16)))
  assert float(sched(k)) == pytest.approx(expected, rel=1e-5)
  assert float(sched(20)) == pytest.approx(1e-4, rel=1e-5)
  constant = learning_rate_schedule(_optim(), 10, 1)
  assert float(constant(0)) == float(constant(9)) == pytest.approx(1e-3)


def test_the_optimizer_settings_come_from_the_config_and_check_the_schedule():
  c = config_lib.get_config()
  c.optim.learning_rate, c.optim.schedule, c.optim.weight_decay = 2e-5, "cosine", 0.1
  optim = Settings.from_config(c).optim
  assert (optim.learning_rate, optim.schedule, optim.weight_decay, optim.b2) == (2e-5, "cosine", 0.1, c.optim.b2)
  with pytest.raises(ValueError, match=r"config.optim.schedule='linear': not one of \['constant', 'cosine'\]"):
    OptimSettings(schedule="linear")


def test_progress_off_a_terminal_is_a_line_per_interval(monkeypatch):
  """Where stderr is a file (a sweep member's train.log), no tqdm bar: the first step's line, then one per
  `every_s`, and the last step's."""
  import io

  from grpo_jax.persist.metrics import ProgressBar
  err = io.StringIO()
  monkeypatch.setattr("sys.stderr", err)
  bar = ProgressBar(total=6, initial=1, enabled=True, every_s=3600.0)
  for step in range(2, 7):
    bar.update({"reward": step / 10, **({"eval/accuracy": 0.5} if step == 4 else {})})
  bar.close()
  lines = err.getvalue().splitlines()
  assert len(lines) == 2 and lines[0].startswith("[GRPO] step 2/6: reward 0.200;") and "first step" in lines[0]
  assert lines[1].startswith("[GRPO] step 6/6: reward 0.600, acc 0.500;") and "s/step" in lines[1]
  bar = ProgressBar(total=6, initial=0, enabled=True, every_s=0.0)  # every step once the interval is 0
  for step in range(1, 7):
    bar.update({"reward": 0.0})
  assert len(err.getvalue().splitlines()) == 2 + 6
