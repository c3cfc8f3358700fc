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
  assert modes["pooled"] == pytest.approx((8 / 2 * 2.0, 1.0))      # 8 tokens over 2 always-busy slots
  lengths = async_sim.lognormal_lengths(180.0, 0.5, 512, 10_000)
  assert lengths.min() >= 1 and lengths.max() == 512 and 170 <= np.median(lengths) <= 190


def test_the_decode_table_prints_each_mode(capsys):
  async_sim.main(["--lengths", "gsm8k", "--rows", "8", "--slots", "4"])
  out = capsys.readouterr().out
  assert all(f" {mode} " in out for mode in ("static", "continuous", "pooled", "segments", "segments+slots"))


def test_chunked_decode_steps():
  assert async_sim.chunked_steps(0, 6, 4) == 0   # every row done after the prefill: no decode step
  assert async_sim.chunked_steps(1, 6, 4) == 4   # one chunk of 4 steps
  assert async_sim.chunked_steps(5, 6, 4) == 5   # past the whole chunks (4 of the 5 steps): the rest, 1 more
  assert async_sim.chunked_steps(3, None, 4) == 4 and async_sim.chunked_steps(3) == 3


def test_segments_by_hand():
  # Rows of 5, 1, 3, 2 tokens, 2 per prompt of 3 tokens; budget 2, staleness 2: three segments. A decode step of r
  # rows takes 1 + 0.5 r s; a prefill of n tokens 0.5 + 0.1 n s.
  lengths, decode, prefill = [5, 1, 3, 2], async_sim.Decode(1.0, 0.5), async_sim.Prefill(0.5, 0.1)
  segs = async_sim.segments(lengths, 2, 2, decode, prefill, prompt_tokens=3, group=2)
  # 1: all 4 rows, new tokens 2, 1, 2, 2; 2 prompts x 3 tokens prefilled (0.5 + 0.6); the longest row's 2nd token
  #    is 1 decode step of 4 rows (3 s): 4.1 s. Decode tokens 1 + 0 + 1 + 1.
  # 2: the rows of 5 and 3 (2 tokens so far), new 2 and 1; prefill 2 x (3 + 2) tokens (1.5 s); 1 step of 2 rows
  #    (2 s): 3.5 s.
  # 3 (no budget): the row of 5 (4 so far): prefill 1 x 7 tokens (1.2 s), its last token comes from it: 1.2 s.
  assert [tuple(s[:6]) for s in segs] == [(1, 4, 6, 1, 4, 3), (2, 2, 10, 1, 2, 1), (3, 1, 7, 0, 1, 0)]
  assert [s.seconds for s in segs] == pytest.approx([4.1, 3.5, 1.2])
  # Budget 0: one call to the end, 4 decode steps of 4 rows: 1.1 + 12
  assert [s.seconds for s in async_sim.segments(lengths, 0, 2, decode, prefill, prompt_tokens=3, group=2)] == \
      pytest.approx([13.1])
  # Staleness 1: the second segment finishes the rows of 5 and 3 (new 3 and 1): 2 decode steps of 2 rows.
  segs = async_sim.segments(lengths, 2, 1, decode, prefill, prompt_tokens=3, group=2)
  assert [s.seconds for s in segs] == pytest.approx([4.1, 1.5 + 2 * 2.0])
  # 2 slots: segment 1's decode tokens 1, 0, 1, 1 over 2 slots end at step 2 (1 + 1 s each): 1.1 + 4
  segs = async_sim.segments(lengths, 2, 2, decode, prefill, prompt_tokens=3, group=2, slots=2)
  assert segs[0].seconds == pytest.approx(5.1) and segs[0].decode_rows == 2
  # The sampler's padding: rows to a multiple of 4, contexts to 8 tokens; a measured first prefill.
  segs = async_sim.segments(lengths, 2, 2, decode, prefill, prompt_tokens=3, group=2, first_prefill_s=0.25,
                            row_bucket=lambda r: -(-r // 4) * 4, width_bucket=lambda w: 8)
  # 1: 0.25 + 1 step of 4 x 2 = 8 rows (5 s); 2: 4 rows x 8 tokens (3.7 s) + 1 step of 4 rows (3 s); 3: 3.7 s
  assert [s.seconds for s in segs] == pytest.approx([5.25, 6.7, 3.7])


def test_the_finishing_segment_runs_before_the_update():
  # 1 s of the 4 s sampling before the update, the rest beside it: 0.25 + 1 + 1 + max(6, 0.1 + 3 + 0.5)
  assert async_sim.overlapped_step(P, 2, 1, transfer_s=0.1, serial=1.0) == pytest.approx(8.25)


FIT_CHECK = """
import numpy as np
import segments_bench as sb
assert sb.mixed_lengths(3.25, 8).tolist() == [4, 4, 3, 3, 3, 3, 3, 3]
# Costs made from a prefill of 1 ms + 2 us x tokens and a decode step of 0.5 ms + 4 us x rows; 3 decode steps to
# the end (max_new_tokens 4), rows unpadded, contexts of 8 tokens after 1 or 2 so far, 16 after 3.
step = lambda r: 0.5e-3 + 4e-6 * r
shapes = dict(rows=256, group=8, max_new_tokens=4, every=8, widths=[8, 8, 8, 16])
costs = dict(shapes=shapes, bucket=lambda r: r, first_prefill=2e-3, first_full=2e-3 + 3 * step(256))
for r in (64, 128, 256):
  for q in (1, 2, 3):
    costs[f"continued_prefill_{r}_{q}"] = 1e-3 + 2e-6 * r * shapes["widths"][q]
    if q < 3:
      costs[f"continued_full_{r}_{q}"] = costs[f"continued_prefill_{r}_{q}"] + 3 * step(r)
prefill, decode = sb.fit(costs)
assert np.allclose(prefill, (1e-3, 2e-6)) and np.allclose(decode, (0.5e-3, 4e-6)), (prefill, decode)
print("ok")
"""


def test_segments_bench_fits_its_costs():
  # benchmarks/segments_bench.py imports its sibling modules as a script does: run it from that folder.
  import os
  import subprocess
  import sys
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
  done = subprocess.run([sys.executable, "-c", FIT_CHECK], cwd=folder, capture_output=True, text=True, timeout=60)
  assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
  done = subprocess.run([sys.executable, "segments_bench.py", "--help"], cwd=folder, capture_output=True, text=True,
                        timeout=60)
  assert done.returncode == 0 and "Rollouts that span updates" in done.stdout, done.stderr


STUDY_CHECK = """
import numpy as np
import producer_study_check as pc
row = {"completions/min_length": 5, "completions/max_length": 48, "completions/mean_length": 30.0,
       "completions/clipped_ratio": 0.25}
lengths = pc.modelled_lengths(row, 64, 48)
assert len(lengths) == 64 and lengths.min() >= 5 and lengths.max() == 48, lengths
assert (lengths == 48).sum() == 16 and abs(lengths.mean() - 30.0) < 0.5, (np.sort(lengths), lengths.mean())
none = pc.modelled_lengths(dict(row, **{"completions/clipped_ratio": 0.0, "completions/max_length": 40}), 64, 48)
assert none.max() == 40 and abs(none.mean() - 30.0) < 0.5, (np.sort(none), none.mean())
# Costs made from a static step of 100 ms over 64 rows, a slot step of 20 ms + 2 ms x slots, a continued prefill of
# 50 ms + 1 ms x padded tokens; 16 decode steps per call; contexts of 64 tokens; rows unpadded.
slot = lambda s: 0.02 + 0.002 * s
shapes = dict(rows=64, group=8, max_new_tokens=48, every=8, slots=16, prompt=40, prefix=24, decode_steps=16)
costs = dict(shapes=shapes, bucket=lambda r: r, width=lambda w: 64, first_prefill=0.5, static_first=0.5 + 16 * 0.1,
             slots_first_prefill=0.4, slots_first=0.4 + 64 * slot(16), half_slots_prefill=0.3,
             half_slots=0.3 + 16 * slot(8), **{f"continued_prefill_{r}": 0.05 + 0.001 * r * 64 for r in (8, 16, 32, 64)})
static, slotted, prefill = pc.fit(costs)
assert np.allclose(static, (0.1, 0.0)) and np.allclose(slotted, (0.02, 0.002)), (static, slotted)
assert np.allclose(prefill, (0.05, 0.001)), prefill
# Every row 48 tokens: the static decode runs 47 steps after the prefill's token (chunks of 8: 40, then the rest 7).
full = dict(row, **{"completions/clipped_ratio": 1.0, "completions/min_length": 48, "completions/mean_length": 48})
assert np.isclose(pc.predicted_sample_s(pc.modelled_lengths(full, 64, 48), {}, costs, static, slotted, prefill),
                  0.5 + 47 * 0.1)
print("ok")
"""


def test_producer_study_check_models_lengths_and_fits_its_costs():
  import os
  import subprocess
  import sys
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
  done = subprocess.run([sys.executable, "-c", STUDY_CHECK], cwd=folder, capture_output=True, text=True, timeout=60)
  assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
