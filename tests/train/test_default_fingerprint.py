"""The default experiment (cut short) and its LoRA + reference variant end with, bit for bit, the
metrics and parameters recorded before the train/ redesign (tests/train/default_fingerprint.py). A CPU without
a record (XLA's CPU code depends on the vector instructions) is skipped, naming the command that records one."""
import json
import subprocess
import sys

import pytest

from tests.train import default_fingerprint as fp
from tests.xla_compiler import default_compiler_env


def test_metrics_and_final_parameters_match_the_recorded_digests(tmp_path):
  with open(fp.RECORD) as f:
    records = json.load(f)
  cpu = fp.cpu_signature()
  if "test" not in records.get(cpu, {}):
    pytest.skip(f"no digest recorded for this CPU ({cpu}); record them at a commit known to be right with "
                "`python -m tests.train.default_fingerprint --record`")
  # Recorded with XLA's default optimizations, which the suite turns off in its own processes.
  done = subprocess.run([sys.executable, "-m", "tests.train.default_fingerprint", "--out", str(tmp_path / "got.json")],
                        cwd=fp.ROOT, env=default_compiler_env(), capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(tmp_path / "got.json") as f:
    assert json.load(f) == {cpu: {"test": records[cpu]["test"]}}
  # The default experiment itself (500 steps, minutes): `python -m tests.train.default_fingerprint --full`
  # prints the digests to compare with records[cpu]["full"].
