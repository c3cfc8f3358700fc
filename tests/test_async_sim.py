"""benchmarks/async_sim.py's step-time model against hand-worked numbers."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import async_sim

# Sampling 4 s, rewards 0.5 s (host), reference 1 s, update 6 s, other 0.25 s, measured on 1 device.
P = async_sim.Phases(sample=4.0, reward=0.5, reference=1.0, update=6.0, devices=1, other=0.25)


def test_scaling():
  assert async_sim.scaled(6.0, 1, 2) == 3.0  # perfect scaling below 8x unless an efficiency is given
  assert async_sim.scaled(6.0, 2, 1) == 12.0  # fewer devices: proportionally slower, no efficiency bonus
  # 0.5 at 8x, interpolated in log2: at 2x (one third of the way to 8x) the efficiency is 1 - 0.5 / 3.
  assert async_sim.scaled(6.0, 1, 2, 0.5) == pytest.approx(3.0 / (1 - 0.5 / 3))
  assert async_sim.scaled(8.0, 1, 8, 0.5) == pytest.approx(2.0)
  assert async_sim.scaled(8.0, 1, 16, 0.5) == pytest.approx(1.0)  # capped at 8x's efficiency


def test_the_three_layouts():
  # sync on 2 devices: 0.25 + 4/2 + 0.5 + 1/2 + 6/2
  assert async_sim.sync_step(P, 2) == pytest.approx(6.25)
  # 1 sampler + 1 trainer, 0.1 s copy: 0.25 + 1 + max(6, 0.1 + 4 + 0.5)
  assert async_sim.overlapped_step(P, 2, 1, transfer_s=0.1) == pytest.approx(7.25)
  # 1 sampler + 3 trainers: 0.25 + 1/3 + max(2, 0.1 + 4 + 0.5): the sampler is the critical path
  assert async_sim.overlapped_step(P, 4, 1, transfer_s=0.1) == pytest.approx(0.25 + 1 / 3 + 4.6)
  # one shared pool: nothing of the compute hides
  assert async_sim.shared_pool_step(P, transfer_s=0.1) == pytest.approx(11.85)


def test_the_table_recommends_the_fastest_split(capsys):
  rows = async_sim.table(P, 4, transfer_s=0.0)
  assert [name for name, _ in rows] == ["sync / inline, 4 devices", "overlapped, sampler 1 + trainer 3",
                                        "overlapped, sampler 2 + trainer 2", "overlapped, sampler 3 + trainer 1"]
  async_sim.main(["--phases", "4,0.5,1,6", "--devices", "4", "--param_gb", "0", "--efficiency", "1",
                  "--sample_efficiency", "1"])
  best = min(rows[1:], key=lambda r: r[1])
  assert f"recommended: {best[0]}" in capsys.readouterr().out


def test_no_benchmark_edits_sys_path():
  # A benchmark imports the installed grpo_jax; run as a script, its own folder is sys.path[0] already.
  import glob
  import os
  import re
  import subprocess
  import sys
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
  for path in glob.glob(os.path.join(folder, "*.py")):
    with open(path) as f:
      assert not re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", f.read()), path
  done = subprocess.run([sys.executable, os.path.join(folder, "async_bench.py"), "--help"], capture_output=True,
                        text=True, timeout=60)
  assert done.returncode == 0 and "Overlapped rollouts" in done.stdout, done.stderr


def test_decode_modes_by_hand():
  # Rows of 4, 1, 1, 2 token steps; a step of r rows takes 1 + 0.5 r seconds.
  lengths, decode = [4, 1, 1, 2], async_sim.Decode(1.0, 0.5)
  # Two slots: slot A takes the 4, slot B the 1, then the second 1 (free at 1), then the 2 (free at 2): ends at 4.
  assert async_sim.makespan(lengths, 2) == 4
  assert async_sim.makespan([1, 1, 1, 5], 2) == 6  # the long row starts late and sets the end
  assert async_sim.makespan(lengths, 8) == 4      # more slots than rows: the longest row
  modes = async_sim.decode_modes(lengths, 2, decode)
  assert modes["static"] == pytest.approx((4 * 3.0, 8 / 16))       # 4 steps of 4 rows at 1 + 2 s
  assert modes["continuous"] == pytest.approx((4 * 2.0, 8 / 8))    # 4 steps of 2 slots at 1 + 1 s
  assert modes["partial"] == pytest.approx((8 / 2 * 2.0, 1.0))     # 8 tokens over 2 always-busy slots
  lengths = async_sim.lognormal_lengths(180.0, 0.5, 512, 10_000)
  assert lengths.min() >= 1 and lengths.max() == 512 and 170 <= np.median(lengths) <= 190


def test_the_decode_table_prints_each_mode(capsys):
  async_sim.main(["--lengths", "gsm8k", "--rows", "8", "--slots", "4"])
  out = capsys.readouterr().out
  assert all(f" {mode} " in out for mode in ("static", "continuous", "partial"))
