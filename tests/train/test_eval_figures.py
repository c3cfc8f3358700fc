"""An evaluation figure is registered once (grpo_jax/train/eval_figures.py) and reaches training's evaluation,
grpo-evaluate, the sweep report's tables and the plots from there: a toy figure registered in this file alone shows
up in all four."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from grpo_jax.commands import evaluate as evaluate_command
from grpo_jax.sweep import results, tables
from grpo_jax.train import eval_figures, loop, plotting
from grpo_jax.train.evaluation import figures_of_rows
from grpo_jax.persist.metrics import read_jsonl
from tests.train.conftest import load_experiment


@pytest.fixture
def worst_at_n(monkeypatch):
  """worst@N: 1 for a prompt whose N samples are all right (its lowest score), registered for this test only."""
  monkeypatch.setattr(eval_figures.FIGURES, "_entries", dict(eval_figures.FIGURES._entries))

  @eval_figures.figure("worst@<n>")
  def worst(scores_PxN, answers_PxN, k):
    return scores_PxN.min(axis=1)
  return worst


def test_a_figure_registered_once_reaches_training_evaluate_the_report_and_the_plots(worst_at_n, tmp_path, capsys,
                                                                                      monkeypatch):
  # Training's evaluation logs it (with its interval) beside the built-in figures.
  config = load_experiment("default")("test")
  config.num_steps, config.eval.every, config.warmstart.enabled, config.log.plot = 1, 1, False, False
  config.eval.samples, config.eval.pass_k = 3, (2,)
  workdir = str(tmp_path / "sweep" / "worst_seed0")
  loop.train(config, workdir)
  evaluated = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "eval/accuracy" in r]
  assert len(evaluated) == 2 and all({"eval/worst@3", "eval/worst@3/lo", "eval/worst@3/hi", "eval/pass@2",
                                      "eval/avg@3"} <= set(r) for r in evaluated)
  assert all(r["eval/worst@3"] <= r["eval/avg@3"] <= r["eval/pass@2"] for r in evaluated)

  # grpo-evaluate prints it, and its rows give it back.
  out_file = str(tmp_path / "rows.jsonl")
  evaluate_command.run([workdir, "--examples", "0", "--pass_k", "2", "--samples", "3", "--out", out_file])
  printed = {name: tuple(map(float, v)) for name, *v in re.findall(
      r"^\s+(\S+)\s+(\S+)\s+\[(\S+), (\S+)\]\s+(?:wilson|bca), ", capsys.readouterr().out, re.M)}
  assert list(printed) == ["accuracy", "full_credit", "avg@3", "pass@2", "worst@3"]
  with open(out_file) as f:
    rows = [json.loads(line) for line in f]
  worst = np.mean([min(s["reward"] for s in r["samples"]) for r in rows])
  assert printed["worst@3"][0] == pytest.approx(worst, abs=5e-4)
  assert figures_of_rows(rows, pass_k=(2,))["eval/worst@3"] == pytest.approx(worst)
  assert evaluated[-1]["eval/worst@3"] == pytest.approx(worst)  # the same checkpoint, prompts and key

  # The report tables its final value (the run is a sweep's finished member), and a plot of the run draws it.
  members = results.load_sweep_dir(str(tmp_path / "sweep"))
  assert [m.status for m in members] == ["done"]
  header = next(line for line in tables.markdown(members).splitlines() if line.startswith("| group |"))
  assert header.endswith("| final avg@3 | final pass@2 | final worst@3 |")
  assert tables.group_table(members)[0]["final:eval/worst@3"].mean == pytest.approx(evaluated[-1]["eval/worst@3"])
  drawn = []
  monkeypatch.setattr(plotting, "draw_panels", lambda panels, path, **kw: drawn.extend(t for t, _ in panels))
  plotting.plot_runs([workdir], str(tmp_path / "curves.png"))
  assert "held-out worst@3" in drawn and "held-out full_credit" not in drawn


def test_a_taken_name_is_refused(monkeypatch):
  monkeypatch.setattr(eval_figures.FIGURES, "_entries", dict(eval_figures.FIGURES._entries))
  with pytest.raises(ValueError, match="evaluation figure named 'pass@<k>' is already registered"):
    eval_figures.figure("pass@<k>")(lambda scores_PxN, answers_PxN, k: scores_PxN[:, 0])
  assert eval_figures.figure_of("eval/pass@4").name == "pass@<k>" and eval_figures.figure_of("eval/pass@4/lo") is None
