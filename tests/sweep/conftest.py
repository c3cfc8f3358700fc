import os
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture
def fake_train_cmd():
  """Trainer command that the runner calls instead of scripts/train.py."""
  return [sys.executable, os.path.join(HERE, "fake_train.py")]


@pytest.fixture
def experiment_file(tmp_path):
  """An experiment file whose sweep has two passing groups × 2 seeds and one member that fails."""
  path = tmp_path / "exp.py"
  path.write_text(textwrap.dedent("""
      from grpo_jax.sweep import spec

      def get_config(preset=None):
        # Only read by the sweep runner's key check; the (fake) trainer builds its own.
        return {"seed": 0, "num_steps": 4, "fail": False, "crash_at": -1, "algo": {"advantage": "grpo"}}

      def get_sweep():
        members = spec.grid(spec.axis("algo.advantage", ["grpo", "rloo"]), seeds=[0, 1])
        members.append({"name": "broken", "overrides": {"fail": True}})
        return members
      """))
  return str(path)
