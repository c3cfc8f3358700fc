"""Short runs that must learn: the default experiment through LoRA adapters, and multi-turn calculator episodes.
Seeds and sizes are fixed; the margins are well below what these runs gain on this machine (in the comments)."""
from __future__ import annotations

import json
import os

from grpo_jax.train import loop
from tests.train.conftest import load_experiment


def _evals(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if "eval/accuracy" in r]


def test_lora_run_of_the_default_experiment_learns(tmp_path):
  config = load_experiment("lora")(None)  # rank 8 on every projection, lr 1e-3, the default warm start
  config.num_steps = 100
  config.eval.every = 100
  config.checkpoint.every = 100
  config.log.plot = False
  summary = loop.train(config, str(tmp_path / "lora"))
  # Measured: 0.316 -> 0.488 (seed 0).
  assert summary.accuracy_after >= summary.accuracy_before + 0.08


def test_calculator_episodes_learn_to_call_the_tool(tmp_path):
  config = load_experiment("calculator")(None)
  config.warmstart.eval_every = 20
  config.warmstart.target_accuracy = 0.05  # a shorter warm start than the experiment's (0.1)
  config.num_steps = 20
  config.eval.every = 20
  config.eval.size = 128
  config.checkpoint.every = 20
  config.log.plot = False
  workdir = str(tmp_path / "calculator")
  summary = loop.train(config, workdir)
  before, after = _evals(workdir)[0], _evals(workdir)[-1]
  assert after["eval/episodes/turns"] > before["eval/episodes/turns"] + 0.2
  assert summary.accuracy_after >= summary.accuracy_before + 0.2
