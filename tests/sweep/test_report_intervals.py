"""grpo-report's intervals: every number in the report's tables comes with its interval, paired comparisons
with p values and Holm's adjustment, the two-level bootstrap over members' eval rows, and --plan."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from grpo_jax.stats import comparisons, power
from grpo_jax.sweep import figures, results, tables
from tests.sweep.conftest import REPO

PROMPTS = [f"{a}+{b}=" for a in range(8) for b in range(8)]  # 64 held-out prompts, shared by every member


def _member(sweep_dir, name, group, seed, rng, skill):
  workdir = os.path.join(sweep_dir, name)
  os.makedirs(os.path.join(workdir, "eval"))
  correct = rng.random(len(PROMPTS)) < skill
  rows = [{"step": s, "reward": skill * s / 4 + 0.01 * seed, "kl": 0.01 * s, "completions/mean_length": 5.0 - s,
           "step_time": 1.0 + 0.1 * seed, "entropy": 1.0 - skill * s / 8} for s in range(1, 5)]
  rows += [{"step": 0, "eval/accuracy": 0.1}, {"step": 4, "eval/accuracy": float(correct.mean())}]
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  with open(os.path.join(workdir, "eval", "step_4.jsonl"), "w") as f:
    for prompt, right in zip(PROMPTS, correct):
      f.write(json.dumps({"prompt": prompt, "gold": "0", "greedy": {"completion": "0", "answer": "0",
                                                                     "reward": float(right), "correct": bool(right)}})
              + "\n")
  with open(os.path.join(workdir, "DONE"), "w") as f:
    json.dump({"wall_s": 10.0 + seed}, f)
  return {"name": name, "group": group, "overrides": {"grpo.loss": group, "seed": seed}}


@pytest.fixture
def study(tmp_path):
  d = str(tmp_path / "study")
  os.makedirs(d)
  rng = np.random.default_rng(0)
  members = [_member(d, f"{group}_seed{seed}", group, seed, rng, skill + 0.03 * seed)
             for group, skill in (("base", 0.4), ("better", 0.6), ("same", 0.4)) for seed in range(4)]
  with open(os.path.join(d, "sweep.json"), "w") as f:
    json.dump({"members": members}, f)
  return d


def _table_cells(md: str):
  """(header, cell) of every data cell of every Markdown table."""
  header = None
  for line in md.splitlines():
    if not line.startswith("|"):
      header = None
      continue
    cells = [c.strip() for c in line.strip("|").split("|")]
    if header is None:
      header = cells
    elif not set(line) <= set("|-"):
      yield from zip(header, cells)


def test_every_number_in_the_reports_tables_has_its_interval(study):
  runs = results.load_sweep_dir(study, extra=["entropy"])
  md = tables.markdown(runs, "t", baseline="base")
  assert "### Final held-out accuracy: seeds and prompts" in md and "Probability of improvement" in md
  counts = {"group", "n", "pairs", "seeds", "SE from seeds", "SE from prompts"}
  checked = 0
  for header, cell in _table_cells(md):
    if header in counts or cell == "–" or "no spread: all differences equal" in cell:  # reward AUC: + 0.125 on each seed
      continue
    assert re.search(r"\[[-+]?\d[\d.e+-]*, [-+]?\d[\d.e+-]*\]", cell), f"{header}: {cell!r} has no interval"
    checked += 1
  assert checked >= 40


def test_paired_rows_give_t_intervals_p_values_and_holm_over_the_first_column(study):
  runs = results.load_sweep_dir(study)
  table = {row["group"]: row for row in tables.paired_table(runs, "base")}
  by_name = {r.name: r for r in runs}
  diffs = [by_name[f"better_seed{s}"].summary["eval_acc_final"] - by_name[f"base_seed{s}"].summary["eval_acc_final"]
           for s in range(4)]
  better = table["better"]["eval_acc_final"]
  assert better.mean == pytest.approx(np.mean(diffs)) and better.p == pytest.approx(comparisons.paired(diffs).p)
  ps = [table[g]["eval_acc_final"].p for g in ("better", "same")]
  assert [table[g]["eval_acc_final_holm"] for g in ("better", "same")] == pytest.approx(comparisons.holm(ps))
  assert better.p < 0.05 and better.interval.lo > 0  # 0.6 vs 0.4 on 64 prompts, 4 seeds


def test_holm_family_is_the_primary_comparisons_and_a_mean_of_column_is_exploratory(study, tmp_path):
  def holm_of(extra):
    runs = results.load_sweep_dir(study, extra=extra)
    return [row["eval_acc_final_holm"] for row in tables.paired_table(runs, "base")]

  assert holm_of(["eval/accuracy"]) == holm_of([])  # a --mean_of column (whose differences have spread) adds no test
  runs = results.load_sweep_dir(study, extra=["eval/accuracy"])
  table = {row["group"]: row for row in tables.paired_table(runs, "base")}
  assert math.isfinite(table["better"]["mean:eval/accuracy"].p)
  assert math.isnan(table["better"]["mean:eval/accuracy_holm"])  # exploratory: unadjusted
  md = tables.paired_markdown(runs, "base")
  assert "exploratory" in md and md.count("Holm") >= 3
  # --primary names the family: reward AUC has no spread here, so naming eval/accuracy's mean makes it the family
  both = tables.paired_table(runs, "base", ["eval_acc_final", "mean:eval/accuracy"])
  ps = [row[c].p for row in both for c in ("eval_acc_final", "mean:eval/accuracy")]
  assert [row[c + "_holm"] for row in both for c in ("eval_acc_final", "mean:eval/accuracy")] == pytest.approx(
      comparisons.holm(ps))
  with pytest.raises(ValueError, match="--primary 'nope'"):
    tables.paired_table(runs, "base", ["nope"])
  from grpo_jax.commands import report as command
  out = str(tmp_path / "out")
  assert command.run([study, "--baseline", "base", "--mean_of", "eval/accuracy", "--primary",
                      "mean:eval/accuracy", "--out", out]) == 0
  with open(os.path.join(out, "summary.md")) as f:
    row = next(line.split(" | ") for line in f if line.startswith("| better | 4 |"))  # the paired table's
  assert "exploratory: unadjusted" in row[2] and ", Holm " in row[4]  # final eval acc, mean eval/accuracy


def test_two_level_bootstrap_reads_the_members_eval_rows(study):
  runs = results.load_sweep_dir(study)
  rows = {row["label"]: row for row in tables.seeds_and_prompts(runs, "base")}
  assert set(rows) == {"base", "better", "same", "better − base", "same − base"}
  accuracies = [r.summary["eval_acc_final"] for r in runs if r.group == "better"]
  assert rows["better"]["two_level"].mean == pytest.approx(np.mean(accuracies))
  two, t = rows["better − base"]["two_level"], rows["better − base"]["t"]
  assert two.interval.lo > 0 and t.lo > 0
  # prompts drawn once for all seeds add width that the seeds-only interval does not have
  assert two.prompt_sd > 0 and two.seed_sd > 0


def test_plan_from_a_pilot_matches_the_power_functions(study):
  runs = results.load_sweep_dir(study)
  result = tables.plan(runs, "eval_acc_final", baseline="base", effect=0.05, width=0.1)
  by_name = {r.name: r for r in runs}
  diffs = [[by_name[f"{g}_seed{s}"].summary["eval_acc_final"] - by_name[f"base_seed{s}"].summary["eval_acc_final"]
            for s in range(4)] for g in ("better", "same")]
  sd = math.sqrt((np.var(diffs[0], ddof=1) + np.var(diffs[1], ddof=1)) / 2)  # pooled, 3 dof each
  assert result["sd"] == pytest.approx(sd) and result["dof"] == 6
  assert result["mde"][5] == pytest.approx(power.min_detectable_effect(sd, 5))
  assert result["seeds"] == power.seeds_needed(0.05, sd)
  assert result["prompts"] == power.prompts_for_width(0.1, p=result["prompt_mean"])
  out = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "report.py"), study, "--baseline", "base",
                        "--plan", "--effect", "0.05", "--width", "0.1"], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert f"| 5 | {result['mde'][5]:.4g} |" in out.stdout and f"needs {result['seeds']} seeds" in out.stdout
  assert not os.path.exists(os.path.join(study, "report"))  # --plan prints, writes nothing
  bad = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "report.py"), study, "--plan", "--metric",
                        "nope"], capture_output=True, text=True, cwd=REPO, timeout=120)
  assert bad.returncode == 2 and "--metric 'nope': not a column" in bad.stderr


def test_curves_draw_the_t_interval_over_seeds_and_a_runs_own_eval_interval(study, monkeypatch):
  from grpo_jax.train import plotting
  runs = [r for r in results.load_sweep_dir(study) if r.group == "better"]
  steps, mean, (lo, hi), count = figures.interval_band(figures.band(runs, "reward"))
  values = np.array([[r.rows[s]["reward"] for r in runs] for s in steps.tolist()])
  half = 3.182446 * values.std(axis=1, ddof=1) / 2  # t(0.975, 3) * std / sqrt(4)
  np.testing.assert_allclose(mean, values.mean(axis=1))
  np.testing.assert_allclose(hi - mean, half, rtol=1e-5)
  np.testing.assert_allclose(mean - lo, half, rtol=1e-5)
  # one run's curves: a figure logged with /lo and /hi is drawn with that interval as its band
  workdir = runs[0].workdir
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"step": 5, "eval/accuracy": 0.5, "eval/accuracy/lo": 0.4, "eval/accuracy/hi": 0.62}) + "\n")
  drawn = {}
  monkeypatch.setattr(plotting, "draw_panels", lambda panels, path, **kw: drawn.update(panels=panels))
  plotting.plot_runs([workdir], os.path.join(workdir, "curves.png"))
  (_, ((_, (steps, values, (lo, hi), _), _),)), = [p for p in drawn["panels"] if p[0] == "held-out accuracy"]
  assert steps.tolist() == [0, 4, 5] and (lo[-1], hi[-1]) == (0.4, 0.62) and np.isnan(lo[0])
