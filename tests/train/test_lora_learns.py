"""A short run that must learn: the default experiment through LoRA adapters (experiments/lora.py). The seed and
sizes are fixed; the margin is well below what the run gains on this machine (in the comment)."""
from __future__ import annotations

from grpo_jax.train import loop
from tests.train.conftest import load_experiment


def test_lora_run_of_the_default_experiment_learns(tmp_path):
  config = load_experiment("lora")(None)  # rank 8 on every projection, lr 1e-3, the default warm start
  config.num_steps = 100
  config.eval.every = 100
  config.checkpoint.every = 100
  config.log.plot = False
  summary = loop.train(config, str(tmp_path / "lora"))
  # Measured: 0.316 -> 0.488 (seed 0).
  assert summary.accuracy_after >= summary.accuracy_before + 0.08
