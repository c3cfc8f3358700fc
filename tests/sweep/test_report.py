import csv
import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from grpo_jax.sweep import figures, results, tables
from grpo_jax.train.plotting import draw_panels
from tests.sweep.conftest import REPO


def _write_member(sweep_dir, name, rows, marker=None, marker_body=None, group=None):
  workdir = os.path.join(sweep_dir, name)
  os.makedirs(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  if marker:
    with open(os.path.join(workdir, marker), "w") as f:
      json.dump(marker_body, f)
  if group:
    with open(os.path.join(workdir, "member.json"), "w") as f:
      json.dump({"name": name, "group": group, "overrides": {}}, f)


def _rows(rewards, kls, lengths, step_times, acc_start, acc_final):
  rows = [{"step": s, "reward": r, "kl": k, "completions/mean_length": n, "step_time": t}
          for s, (r, k, n, t) in enumerate(zip(rewards, kls, lengths, step_times))]
  # Evaluation logged as separate rows for the same steps, as a trainer may do.
  rows += [{"step": 0, "eval/accuracy": acc_start}, {"step": len(rewards) - 1, "eval/accuracy": acc_final}]
  return rows


@pytest.fixture
def sweep_dir(tmp_path):
  d = str(tmp_path / "sweep")
  os.makedirs(d)
  with open(os.path.join(d, "sweep.json"), "w") as f:
    json.dump({"members": [{"name": n, "group": g, "overrides": {"algo.x": g, "seed": n[-1]}} for n, g in
                           [("a_seed0", "a"), ("a_seed1", "a"), ("b_seed0", "b"), ("b_seed1", "b"),
                            ("c_seed0", "c")]]}, f)
  _write_member(d, "a_seed0", _rows([0.1, 0.3, 0.5, 0.7], [0.0, 0.01, 0.02, 0.04], [4, 5, 6, 5], [10, 1, 2, 3],
                                    0.2, 0.6), "DONE", {"wall_s": 20.0})
  _write_member(d, "a_seed1", _rows([0.2, 0.4, 0.6, 0.8], [0.0, 0.01, 0.01, 0.02], [5, 5, 5, 5], [9, 2, 2, 2],
                                    0.2, 0.8), "DONE", {"wall_s": 30.0})
  _write_member(d, "b_seed0", _rows([0.0], [0.0], [1], [1.0], 0.1, 0.1), "FAILED",
                {"rc": 1, "wall_s": 3.0, "error": "Traceback (most recent call last):\nValueError: boom"})
  _write_member(d, "b_seed1", _rows([0.5, 0.5], [0.1, 0.3], [2, 4], [4.0, 4.0], 0.3, 0.9), "DONE", {"wall_s": 9.0})
  # Launched with the bare trainer command: finished by the trainer's summary.json, its wall time from there.
  _write_member(d, "c_seed1", _rows([0.5], [0.0], [3], [1.0], 0.5, 0.5), "summary.json", {"wall_s": 7.0})
  # A member that is in no plan: found through its member.json; not finished.
  _write_member(d, "extra_seed0", [{"step": 0, "reward": 1.0, "step_time": 2.5}], group="extra")
  return d


def test_read_metrics_merges_rows_per_step_and_skips_a_truncated_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0, "reward": 0.5}\n{"step": 1, "reward": 0.1}\n{"step": 0, "eval/accuracy": 0.25}\n'
                  '{"step": 1, "reward": 0.2}\n{"step": 2, "rew')
  rows = results.read_metrics(str(path))
  assert rows == {0: {"step": 0, "reward": 0.5, "eval/accuracy": 0.25}, 1: {"step": 1, "reward": 0.2}}


def test_member_numbers_match_hand_computation(sweep_dir):
  runs = {r.name: r for r in results.load_sweep_dir(sweep_dir)}
  a0 = runs["a_seed0"].summary
  assert a0["eval_acc_start"] == 0.2 and a0["eval_acc_final"] == 0.6
  assert a0["reward_auc"] == pytest.approx((0.1 + 0.3 + 0.5 + 0.7) / 4)
  assert a0["kl_final"] == 0.04
  assert a0["mean_length"] == pytest.approx(5.0)
  assert a0["steps_per_s"] == pytest.approx(1 / 2.5)  # median of 10, 1, 2, 3
  assert a0["wall_s"] == 20.0 and a0["steps"] == 3
  assert runs["b_seed0"].status == "failed" and runs["b_seed0"].error.endswith("ValueError: boom")
  assert runs["c_seed0"].status == "pending" and math.isnan(runs["c_seed0"].summary["reward_auc"])
  assert runs["c_seed1"].status == "done" and runs["c_seed1"].summary["wall_s"] == 7.0
  assert runs["extra_seed0"].status == "unfinished" and runs["extra_seed0"].group == "extra"
  assert runs["extra_seed0"].summary["wall_s"] == 2.5  # no runner record: the sum of step_time


def test_curve_panels_keep_kl_where_logged_and_draw_no_floor_without_one(sweep_dir):
  panels = figures.curve_panels(results.load_sweep_dir(sweep_dir))
  assert [title for title, _ in panels] == ["reward (train), moving avg 10", "held-out accuracy",
                                            "KL to reference, moving avg 10"]
  assert all(floor is None for _, curves in panels for *_, floor in curves)


def test_member_wall_time_counts_an_attempt_the_done_marker_missed(sweep_dir):
  # An older DONE summed only the attempts that recorded an end; the trainer's own total is larger.
  with open(os.path.join(sweep_dir, "a_seed0", "summary.json"), "w") as f:
    json.dump({"wall_s": 120.0}, f)
  runs = {r.name: r for r in results.load_sweep_dir(sweep_dir)}
  assert runs["a_seed0"].summary["wall_s"] == 120.0 and runs["a_seed1"].summary["wall_s"] == 30.0


def test_group_table_mean_and_sample_std_over_finished_seeds(sweep_dir):
  table = {row["group"]: row for row in tables.group_table(results.load_sweep_dir(sweep_dir))}
  assert list(table) == ["a", "b", "c", "extra"]  # plan order, then unplanned
  a = table["a"]
  assert (a["members"], a["done"], a["failed"]) == (2, 2, 0)
  mean, std, n = a["eval_acc_final"][:3]
  assert (mean, n) == (pytest.approx(0.7), 2) and std == pytest.approx(math.sqrt(0.02))
  # the 95% t interval over the 2 seeds: mean ± t(0.975, 1) * std / sqrt(2), t(0.975, 1) = 12.706
  half = 12.7062047 * math.sqrt(0.02) / math.sqrt(2)
  assert (a["eval_acc_final"].lo, a["eval_acc_final"].hi) == (pytest.approx(0.7 - half), pytest.approx(0.7 + half))
  mean, std, _ = a["reward_auc"][:3]
  assert mean == pytest.approx(0.45) and std == pytest.approx(math.sqrt(0.005))
  mean, std, _ = a["steps_per_s"][:3]
  assert mean == pytest.approx((0.4 + 0.5) / 2) and std == pytest.approx(np.std([0.4, 0.5], ddof=1))
  assert a["wall_s"][:2] == (pytest.approx(25.0), pytest.approx(math.sqrt(50.0)))
  b = table["b"]  # the failed seed is not averaged in
  assert (b["done"], b["failed"]) == (1, 1)
  assert b["eval_acc_final"][0] == 0.9 and math.isnan(b["eval_acc_final"][1]) and b["eval_acc_final"][2] == 1
  assert math.isnan(b["eval_acc_final"].lo)  # one seed: no interval
  assert b["kl_final"][0] == 0.3 and b["steps_per_s"][0] == 0.25
  assert table["c"]["reward_auc"][:3] == (0.5, pytest.approx(float("nan"), nan_ok=True), 1)


def test_markdown_and_csv_list_every_group_and_the_failed_member(sweep_dir):
  runs = results.load_sweep_dir(sweep_dir)
  md = tables.markdown(runs, "t")
  assert "| a | 2/2 | 0.200 [0.200, 0.200] | 0.700 [-0.571, 1.971] | 0.450 [-0.185, 1.085] |" in md
  assert "| b | 1/2 | 0.300 (1 seed) | 0.900 (1 seed) |" in md
  assert ("| c | 1/2 | 0.500 (1 seed) | 0.500 (1 seed) | 0.500 (1 seed) | 0.00e+00 (1 seed) | 3.00 (1 seed) | "
          "1.00 (1 seed) | 7 (1 seed) |") in md
  assert "### Failed members" in md and "`b_seed0` (group b): `ValueError: boom`" in md
  assert "- a: `algo.x=a`\n" in md and "- extra: (none recorded)" in md
  assert "- not started (1): `c_seed0`" in md and "`extra_seed0` (group extra): unfinished, 0 steps logged" in md
  groups = list(csv.DictReader(io.StringIO(tables.groups_csv(runs))))
  assert [g["group"] for g in groups] == ["a", "b", "c", "extra"]
  assert float(groups[0]["reward_auc_mean"]) == pytest.approx(0.45)
  assert float(groups[0]["reward_auc_std"]) == pytest.approx(math.sqrt(0.005))
  members = {m["name"]: m for m in csv.DictReader(io.StringIO(tables.members_csv(runs)))}
  assert members["b_seed0"]["status"] == "failed" and members["b_seed0"]["error"] == "ValueError: boom"
  assert float(members["a_seed1"]["mean_length"]) == 5.0


def test_regex_grouper(sweep_dir):
  runs = results.load_sweep_dir(sweep_dir, results.regex_grouper(r"^(\w)[a-z]*_"))
  assert [r.group for r in runs] == ["a", "a", "b", "b", "c", "c", "e"]
  runs = results.load_sweep_dir(sweep_dir, results.regex_grouper(r"seed(?P<group>\d)"))
  assert [r.group for r in runs] == ["0", "1", "0", "1", "0", "1", "0"]
  with pytest.raises(ValueError, match="does not match member 'extra_seed0'"):
    results.load_sweep_dir(sweep_dir, results.regex_grouper(r"^[abc]_"))


def test_band_is_mean_and_sample_std_over_members_per_step(sweep_dir):
  runs = {r.name: r for r in results.load_sweep_dir(sweep_dir)}
  steps, mean, std, count = figures.band([runs["a_seed0"], runs["b_seed1"]], "reward")
  np.testing.assert_array_equal(steps, [0, 1, 2, 3])
  np.testing.assert_allclose(mean, [0.3, 0.4, 0.5, 0.7])
  np.testing.assert_allclose(std[:2], [np.std([0.1, 0.5], ddof=1), np.std([0.3, 0.5], ddof=1)])
  assert np.isnan(std[2:]).all() and count.tolist() == [2, 2, 1, 1]
  _, smoothed, _, _ = figures.band([runs["a_seed0"]], "reward", smooth=2)
  np.testing.assert_allclose(smoothed, [0.1, 0.2, 0.4, 0.6])


def test_paired_band_differences_by_seed(sweep_dir):
  runs = {r.name: r for r in results.load_sweep_dir(sweep_dir)}
  steps, mean, std, count = figures.paired_band([runs["b_seed1"], runs["b_seed0"]], [runs["a_seed0"],
                                                                                    runs["a_seed1"]], "reward")
  # b_seed1 - a_seed1 at steps 0, 1: 0.5 - 0.2, 0.5 - 0.4; b_seed0 - a_seed0 at step 0: 0.0 - 0.1.
  np.testing.assert_array_equal(steps, [0, 1])
  np.testing.assert_allclose(mean, [(0.3 - 0.1) / 2, 0.1])
  np.testing.assert_allclose(std[0], np.std([0.3, -0.1], ddof=1))
  assert np.isnan(std[1]) and count.tolist() == [2, 1]


def test_report_cli_writes_table_csv_and_figures(sweep_dir, tmp_path):
  out = str(tmp_path / "out")
  result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "report.py"), sweep_dir, "--out", out,
                           "--smooth", "2", "--baseline", "a", "--wall_clock"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "| a | 2/2 |" in result.stdout and "difference to `a`" in result.stdout
  assert sorted(os.listdir(out)) == ["curves.png", "groups.csv", "members.csv", "paired.png", "summary.md",
                                     "wall_clock.png"]
  for name in ("curves.png", "paired.png", "wall_clock.png"):
    with open(os.path.join(out, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_wall_clock_panel_puts_each_evaluation_at_the_mean_seconds_of_its_seeds(tmp_path):
  """Two seeds of g: evaluations at steps 0 and 2; the seconds up to an evaluation are its member's step_time and
  timing/eval_s summed over the steps up to it, averaged over the seeds that evaluated there."""
  d = str(tmp_path / "sweep")
  os.makedirs(d)
  for name, times, evals, accs in [("g_seed0", [4.0, 1.0, 2.0], [0.5, 0.25], [0.1, 0.5]),
                                   ("g_seed1", [6.0, 3.0, 1.0], [1.5, 0.75], [0.3, 0.9])]:
    rows = [{"step": s, "step_time": t} for s, t in enumerate(times)]
    rows += [{"step": 0, "eval/accuracy": accs[0], "timing/eval_s": evals[0]},
             {"step": 2, "eval/accuracy": accs[1], "timing/eval_s": evals[1]}]
    _write_member(d, name, rows, "DONE", {"wall_s": 1.0}, group="g")
  ((title, [(label, (x, mean, (lo, hi), count), marker)], xlabel),) = figures.wall_clock_panels(
      results.load_sweep_dir(d))
  # seed 0: 4 + 0.5 = 4.5 at step 0, 4.5 + 1 + 2 + 0.25 = 7.75 at step 2; seed 1: 7.5, then 7.5 + 3 + 1 + 0.75 = 12.25
  np.testing.assert_allclose(x, [(4.5 + 7.5) / 2, (7.75 + 12.25) / 2])
  np.testing.assert_allclose(mean, [0.2, 0.7])
  half = 12.706204736 * np.std([0.5, 0.9], ddof=1) / np.sqrt(2)  # Student's t, 1 degree of freedom
  np.testing.assert_allclose([lo[1], hi[1]], [0.7 - half, 0.7 + half], rtol=1e-6)
  assert label == "g (n=2)" and count.tolist() == [2, 2] and xlabel.startswith("seconds")


def test_select_groups(sweep_dir):
  runs = results.select_groups(results.load_sweep_dir(sweep_dir), "^(a|c)$")
  assert [r.name for r in runs] == ["a_seed0", "a_seed1", "c_seed0", "c_seed1"]
  with pytest.raises(ValueError, match="matches none of the groups"):
    results.select_groups(runs, "^z")


def test_paired_differences_to_a_baseline_group(sweep_dir):
  runs = results.load_sweep_dir(sweep_dir)
  table = {row["group"]: row for row in tables.paired_table(runs, "a")}
  # b: only b_seed1 finished; paired with a_seed1: final acc 0.9 - 0.8, reward AUC 0.5 - 0.5.
  b = table["b"]
  assert b["pairs"] == 1 and b["eval_acc_final"][0] == pytest.approx(0.1) and b["eval_acc_final_wins"] == 1
  assert b["reward_auc"][0] == pytest.approx(0.0) and b["reward_auc_wins"] == 0
  # c: c_seed1 (done via summary.json) against a_seed1: 0.5 - 0.8.
  assert table["c"]["eval_acc_final"][:1] == (pytest.approx(-0.3),) and table["c"]["pairs"] == 1
  assert table["extra"]["pairs"] == 0
  md = tables.markdown(runs, "t", baseline="a")
  assert ("| b | 1 | +0.100 (1 seed: no interval; 1/1) | +0.000 (1 seed: no interval; 0/1) |" in md
          and "| extra | 0 | – | – |" in md)
  with pytest.raises(ValueError, match="'z' is not a group"):
    tables.paired_table(runs, "z")


def test_paired_cell_without_spread_says_why_it_has_no_p(tmp_path):
  d = str(tmp_path / "flat")
  for seed, acc in enumerate([0.6, 0.8]):  # b is a + 0.1 on both seeds: the differences have no spread
    for group, final in (("a", acc), ("b", acc + 0.1)):
      _write_member(d, f"{group}_seed{seed}", _rows([0.5], [0.0], [3], [1.0], 0.2, final), "DONE", {"wall_s": 1.0})
  runs = results.load_sweep_dir(d)
  (row,) = tables.paired_table(runs, "a")
  assert row["eval_acc_final"].p is None and math.isnan(row["eval_acc_final_holm"])
  assert "| b | 2 | +0.100, no spread: all differences equal (2/2) |" in tables.paired_markdown(runs, "a")


def test_probability_of_improvement_is_paired_when_seeds_pair(tmp_path):
  d = str(tmp_path / "poi")
  for seed, (a, b) in enumerate([(0.3, 0.5), (0.4, 0.4), (0.8, 0.7), (0.1, 0.2)]):
    for group, final in (("a", a), ("b", b)):
      _write_member(d, f"{group}_seed{seed}", _rows([0.5], [0.0], [3], [1.0], 0.2, final), "DONE", {"wall_s": 1.0})
  (row,) = tables.paired_table(results.load_sweep_dir(d), "a")
  assert row["eval_acc_final_poi"][0] == 0.625  # b higher, tie, lower, higher; every run against every: 9.5 / 16


def test_mean_of_extra_metrics_adds_columns(sweep_dir):
  runs = results.load_sweep_dir(sweep_dir, extra=["kl", "missing"])
  a0 = next(r for r in runs if r.name == "a_seed0")
  assert a0.summary["mean:kl"] == pytest.approx((0.0 + 0.01 + 0.02 + 0.04) / 4)
  assert math.isnan(a0.summary["mean:missing"])
  md = tables.markdown(runs, "t")
  assert "| mean kl | mean missing |" in md
  assert "mean:kl_mean" in tables.groups_csv(runs).splitlines()[0]
  # ... and paired differences of those means to the baseline member with the same seed.
  paired = {row["group"]: row for row in tables.paired_table(runs, "a")}
  b1 = next(r for r in runs if r.name == "b_seed1")
  a1 = next(r for r in runs if r.name == "a_seed1")
  assert paired["b"]["mean:kl"][0] == pytest.approx(b1.summary["mean:kl"] - a1.summary["mean:kl"])
  assert "Δ mean kl" in tables.paired_markdown(runs, "a")
  # --curves: one panel per metric in metrics.png.
  import matplotlib.image
  path = os.path.join(sweep_dir, "metrics.png")
  draw_panels(figures.metric_panels(runs, ["kl", "reward"], smooth=1), path)
  assert matplotlib.image.imread(path).shape[1] > matplotlib.image.imread(path).shape[0]  # two panels side by side


def test_sweep_over_tasks_gets_a_table_per_metric_with_a_column_per_task(tmp_path):
  """A 'variant x task' sweep (2 losses x 2 tasks x 2 seeds): each cell is the mean over that (variant, task)'s
  finished seeds, and the reasoning-gym constant-answer floor (logged at step 0) is its own table."""
  d = str(tmp_path / "sweep")
  os.makedirs(d)
  members, acc = [], {}
  for variant in ("grpo", "dr_grpo"):
    for task, base in (("reasoning_gym:aiw", 0.1), ("reasoning_gym:simple_equations", 0.3)):
      short = task.split(":")[1]
      for seed in (0, 1):
        name = f"{variant}_{short}_seed{seed}"
        final = base + 0.1 * seed + (0.2 if variant == "grpo" else 0.0)
        acc[name] = final
        members.append({"name": name, "group": f"{variant}_{short}",
                        "overrides": {"grpo.loss": variant, "task.name": task, "task.options": "{}", "seed": seed}})
        _write_member(d, name, [{"step": 0, "eval/accuracy": base, "eval/constant_answer": base / 2},
                                {"step": 1, "reward": 0.5, "step_time": 1.0},
                                {"step": 2, "eval/accuracy": final, "eval/full_credit": final - 0.05}],
                      "DONE", {"wall_s": 1.0})
  with open(os.path.join(d, "sweep.json"), "w") as f:
    json.dump({"members": members}, f)
  tasks, rows = tables.task_table(results.load_sweep_dir(d))
  assert tasks == ["aiw", "simple_equations"]
  by_variant = {row["variant"]: row for row in rows}
  assert set(by_variant) == {"grpo", "dr_grpo"}
  cell = by_variant["grpo"]["simple_equations"]
  assert cell["eval_acc_final"][:2] == (pytest.approx((acc["grpo_simple_equations_seed0"]
                                                       + acc["grpo_simple_equations_seed1"]) / 2),
                                        pytest.approx(0.1 / math.sqrt(2)))
  assert cell["eval_acc_start"][0] == pytest.approx(0.3) and cell["constant_answer"][0] == pytest.approx(0.15)
  assert cell["full_credit_final"][0] == pytest.approx(cell["eval_acc_final"][0] - 0.05)
  assert by_variant["dr_grpo"]["aiw"]["eval_acc_final"][0] == pytest.approx(0.15)
  markdown = tables.task_markdown(results.load_sweep_dir(d))
  assert "### one constant answer by task" in markdown and "| grpo | " in markdown
  # The figure: no KL panel (none logged), each group's floor (its seeds' mean) on the held-out panel.
  panels = figures.curve_panels(results.load_sweep_dir(d))
  assert [title for title, _ in panels] == ["reward (train), moving avg 10",
                                            "held-out accuracy (dotted: one constant answer)"]
  floors = {label.split(" ")[0]: floor for label, _, _, floor in panels[1][1]}
  assert floors["grpo_aiw"] == pytest.approx(0.05) and floors["dr_grpo_simple_equations"] == pytest.approx(0.15)
