"""grpo_jax/train/timing.py: the process's age against a sleep it did, and the split's arithmetic."""
import subprocess
import sys

import pytest

from grpo_jax.train.timing import TimeSplit


def test_seconds_since_launch_counts_the_time_before_it_was_asked():
  code = ("import time; time.sleep(1.5); from grpo_jax.train.timing import seconds_since_launch; "
          "print(seconds_since_launch())")
  age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
  assert 1.5 <= age < 1.5 + 20  # the sleep, plus the interpreter's start and one import


def test_split_sums_step_phases_and_gives_the_first_steps_excess_over_the_median():
  split = TimeSplit()
  for sample, update in [(4.0, 9.0), (1.0, 2.0), (1.5, 2.5), (1.0, 3.0)]:
    split.add_step({"timing/sample_s": sample, "timing/update_s": update, "step_time": sample + update})
  out = split.as_dict()
  assert out["sample"] == 7.5 and out["update"] == 16.5 and out["reference"] == 0.0
  assert out["first_step_excess"] == pytest.approx(13.0 - 4.0)  # median of 3, 4, 4
  assert split.launch_to_first_step_s is not None
