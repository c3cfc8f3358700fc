"""A user's mistake at the launcher is one line naming the problem and the fix, with exit code 2 (no traceback);
--debug shows the traceback. The sweep runners do not retry exit code 2 (grpo_jax/errors.py). More cases (an
unknown key, bad values, a missing model directory): tests/test_config.py::test_launcher_stops_before_compiling."""
import fcntl
import os
import subprocess
import sys

import pytest

from tests.train.conftest import ROOT, load_experiment

CONFIG = os.path.join(ROOT, "experiments", "default.py:test")


def _train(workdir, *flags, env=None):
  return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config", CONFIG,
                         "--workdir", str(workdir), *flags], capture_output=True, text=True, timeout=120, cwd=ROOT,
                        env=env)


def _one_line(proc, *words):
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith("grpo-train: error: ") and all(w in line for w in words), line
  return line


def test_a_busy_workdir(tmp_path):
  with open(tmp_path / ".lock", "a+") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.write("process 1 on elsewhere\n")
    lock.flush()
    _one_line(_train(tmp_path), f"workdir {tmp_path} is in use by", "use another --workdir")
    debug = _train(tmp_path, "--debug")
  assert debug.returncode != 0 and "Traceback" in debug.stderr and "WorkdirError" in debug.stderr


def test_a_changed_setting_on_a_used_workdir(tmp_path):
  # A workdir as a run with group_size 8 leaves it (config.json and a checkpoint), resumed with another value.
  config = load_experiment("default")("test")
  (tmp_path / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))
  (tmp_path / "checkpoints" / "0").mkdir(parents=True)
  _one_line(_train(tmp_path, f"--config.grpo.group_size={config.grpo.group_size * 2}"),
            "holds a run started with other settings", "grpo.group_size", "Use a new --workdir")


def test_a_missing_config_file_and_data_file(tmp_path):
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config",
                         "experiments/no_such.py", "--workdir", str(tmp_path)], capture_output=True, text=True,
                        timeout=120, cwd=ROOT)
  _one_line(proc, "experiments/no_such.py", "no such file")
  _one_line(_train(tmp_path, "--config.task.name=dataset", f"--config.task.train_path={tmp_path}/none.jsonl",
                   f"--config.model.hf_path={tmp_path}"), "config.task.train_path", "does not exist")


def test_a_missing_optional_extra(tmp_path):
  fake = tmp_path / "hide" / "reasoning_gym"
  fake.mkdir(parents=True)
  (fake / "__init__.py").write_text("raise ImportError('No module named reasoning_gym')\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "hide"), ROOT])}
  _one_line(_train(tmp_path / "w", "--config.task.name=reasoning_gym:leg_counting", env=env), ".[gym]")


def test_an_unknown_key_names_the_closest_keys(tmp_path):
  _one_line(_train(tmp_path, "--config.grpo.epsilon=0.2"), "config.grpo.epsilon: no such key",
            "config.grpo.epsilon_low", "config.grpo.epsilon_high")
  _one_line(_train(tmp_path, "--config.grpo.learning_rate=1e-5"), "config.optim.learning_rate")
  _one_line(_train(tmp_path, "--config.grpo.beta.x=1"), "config.grpo.beta.x: no such key")
  assert not (tmp_path / "checkpoints").exists()


def test_an_old_key_is_one_line_naming_the_closest(tmp_path):
  proc = _train(tmp_path, "--config.task.holdout_fraction=0.2")
  _one_line(proc, "config.task.holdout_fraction: no such key; did you mean config.task.heldout_fraction or")
