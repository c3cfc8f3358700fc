"""curves.png while a run trains (grpo_jax/train/plotting.py: CurvesRefresher): drawn in the background after an
evaluation, no more often than its interval, and a failed drawing never stops the run."""
import json
import os
import time

from grpo_jax.train.plotting import CurvesRefresher


def metrics_file(workdir, steps: int) -> None:
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step in range(steps + 1):
      f.write(json.dumps({"step": step, "reward": step / 10, "eval/accuracy": step / 20, "kl": 0.0, "entropy": 1.0,
                          "completions/mean_length": 3.0}) + "\n")


def test_drawn_after_an_evaluation_at_most_once_an_interval(tmp_path):
  metrics_file(tmp_path, 10)
  path = str(tmp_path / "curves.png")
  curves = CurvesRefresher(str(tmp_path), path, enabled=True, min_interval_s=0.0)
  curves.after_eval()
  curves.close()
  assert os.path.getsize(path) > 10_000
  first = os.path.getmtime(path)
  curves.min_interval_s = 3600.0  # the next evaluation comes too soon: nothing is drawn
  curves.after_eval()
  curves.close()
  assert os.path.getmtime(path) == first
  # A drawing that took 0.4 s waits 20 of them (8 s) even with no interval; past that it draws again.
  curves.min_interval_s, curves._cost = 0.0, 0.4
  before = curves._thread
  curves.after_eval()
  assert curves._thread is before  # no new drawing
  curves._last -= 9.0
  time.sleep(0.01)
  curves.after_eval()
  curves.close()
  assert os.path.getmtime(path) > first


def test_disabled_or_failing_never_stops_the_run(tmp_path):
  curves = CurvesRefresher(str(tmp_path), str(tmp_path / "curves.png"), enabled=False, min_interval_s=0.0)
  curves.after_eval()
  curves.close()
  assert not (tmp_path / "curves.png").exists()
  said = []
  curves = CurvesRefresher(str(tmp_path / "no_run"), str(tmp_path / "curves.png"), enabled=True,
                           min_interval_s=0.0, log=said.append)
  curves.after_eval()  # no metrics.jsonl: the drawing fails in its thread
  curves.close()
  assert not curves.enabled and said and "not refreshed" in said[0]
