"""curves.png while a run trains (grpo_jax/train/plotting.py: CurvesRefresher): redrawn after evaluations by a
helper process at the lowest CPU priority, within its share of a core, requests made meanwhile merged into one,
and a failed drawing never stops the run."""
import json
import os
import threading
import time

from grpo_jax.train.plotting import CurvesRefresher, serve


def metrics_file(workdir, steps: int) -> None:
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step in range(steps + 1):
      f.write(json.dumps({"step": step, "reward": step / 10, "eval/accuracy": step / 20, "kl": 0.0, "entropy": 1.0,
                          "completions/mean_length": 3.0}) + "\n")


def wait_for(condition, timeout_s=60.0):
  deadline = time.time() + timeout_s
  while not condition():
    assert time.time() < deadline, "timed out"
    time.sleep(0.05)


def test_each_evaluation_redraws_the_figure_from_a_lowest_priority_helper(tmp_path):
  metrics_file(tmp_path, 10)
  path = tmp_path / "curves.png"
  curves = CurvesRefresher(str(tmp_path), str(path), enabled=True)
  curves.after_eval()
  helper = curves._helper
  assert os.sched_getscheduler(helper.pid) == os.SCHED_IDLE  # it only takes the cores the run leaves idle
  wait_for(lambda: path.exists() and path.stat().st_size > 10_000)
  first = path.stat().st_mtime_ns
  metrics_file(tmp_path, 20)  # the next evaluation: drawn again, by the same helper
  curves.after_eval()
  wait_for(lambda: path.stat().st_mtime_ns > first)
  assert curves._helper is helper
  curves.close()
  assert helper.returncode == 0


def test_requests_made_during_a_drawing_make_one_drawing(tmp_path):
  metrics_file(tmp_path, 10)
  read, write = os.pipe()
  os.write(write, b"draw\n" * 3)  # three evaluations while the helper was busy
  drawings = []
  helper = threading.Thread(target=lambda: drawings.append(serve(str(tmp_path), str(tmp_path / "c.png"), read)))
  helper.start()
  wait_for(lambda: (tmp_path / "c.png").exists())
  os.close(write)  # the run ends: the helper exits
  helper.join(30)
  os.close(read)
  assert drawings == [1]


def test_the_helper_keeps_to_its_share_of_a_core(tmp_path):
  metrics_file(tmp_path, 10)
  read, write = os.pipe()
  png = tmp_path / "c.png"
  drawings = []
  helper = threading.Thread(target=lambda: drawings.append(serve(str(tmp_path), str(png), read, cpu_share=1e-4)))
  helper.start()
  os.write(write, b"draw\n")
  wait_for(lambda: png.exists() and png.stat().st_size > 10_000)
  first = png.stat().st_mtime_ns
  os.write(write, b"draw\n")  # the first drawing's imports and layout are not paced: the second comes at once
  wait_for(lambda: png.stat().st_mtime_ns > first)  # written whole: the figure is renamed into place
  second = png.stat().st_mtime_ns
  os.write(write, b"draw\n")  # the next evaluation, within 10,000 drawing times of the second: it waits
  time.sleep(2.0)
  assert png.stat().st_mtime_ns == second
  os.close(write)
  helper.join(30)
  os.close(read)
  assert drawings == [2]


def test_a_failed_drawing_is_said_and_the_next_request_tries_again(tmp_path, capsys):
  read, write = os.pipe()
  drawings = []
  helper = threading.Thread(target=lambda: drawings.append(serve(str(tmp_path / "no_run"), str(tmp_path / "c.png"),
                                                                 read)))
  helper.start()
  said = []
  for _ in range(2):
    os.write(write, b"draw\n")
    wait_for(lambda: said.append(capsys.readouterr().err) or "not refreshed" in said[-1])
  os.close(write)
  helper.join(30)
  os.close(read)
  assert drawings == [0] and "metrics.jsonl does not exist" in said[-1]


def test_disabled_or_gone_never_stops_the_run(tmp_path):
  curves = CurvesRefresher(str(tmp_path), str(tmp_path / "curves.png"), enabled=False)
  curves.after_eval()
  curves.close()
  assert curves._helper is None and not (tmp_path / "curves.png").exists()
  said = []
  curves = CurvesRefresher(str(tmp_path), str(tmp_path / "curves.png"), enabled=True, log=said.append)
  curves.after_eval()
  curves._helper.kill()  # the helper died (out of memory, say): the next request finds its pipe closed
  curves._helper.wait()
  curves.after_eval()
  curves.close()
  assert not curves.enabled and said and "no longer refreshed" in said[0]
