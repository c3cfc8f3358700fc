"""The tool_arithmetic task (2-digit products, with calculator episodes as demonstrations), the warm start's
masking of observations, the env config's validation, and the calculator experiment's test preset for 2 steps."""
from __future__ import annotations

import os

import numpy as np
import pytest

from grpo_jax.settings import Settings
from grpo_jax.data.synthetic import ToolArithmeticTask
from grpo_jax.envs.calculator import Calculator
from grpo_jax.train.warmstart import sft_batch
from grpo_jax.train import checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rows_are_products_and_demonstrations_replay_the_calculator():
  task = ToolArithmeticTask(seed=0, tool_fraction=0.3)
  rows = task.train_rows(0, 500)
  with_tool = 0
  for prompt, answer, demo in zip(rows["prompt"], rows["answer"], rows["demonstration"]):
    a, b = map(int, prompt.rstrip("=").split("*"))
    assert 10 <= a < 100 and 10 <= b < 100 and answer == str(a * b)
    if len(demo) == 3:  # call, the calculator's observation (not trained on), answer
      with_tool += 1
      env = Calculator()
      (call, t1), (observation, t0), (final, t2) = demo
      assert (t1, t0, t2) == (1, 0, 1) and env.step(call).observation == observation and final == answer
    else:
      assert demo == [[answer, 1]]
    assert len(prompt) <= task.max_prompt_chars
    assert sum(len(text) for text, _ in demo) + 1 <= task.max_episode_chars
  assert 110 < with_tool < 190  # about tool_fraction of the rows
  assert rows == task.train_rows(0, 500) and task.train_rows(100, 3)["prompt"] == rows["prompt"][100:103]
  heldout = set(task.eval_rows(200)["prompt"])
  assert heldout == set(ToolArithmeticTask(seed=4).eval_rows(200)["prompt"])
  assert not heldout & set(rows["prompt"]) and not heldout & set(task.train_rows(5000, 3000)["prompt"])


def test_warm_start_targets_skip_the_observation():
  task = ToolArithmeticTask()
  columns = {"prompt": ["37*48=", "12*10="], "answer": ["1776", "120"],
             "demonstration": [[["37*48?", 1], ["[1776]", 0], ["1776", 1]], [["120", 1]]]}
  prompt, prompt_mask, target, target_mask = sft_batch(task.tokenizer, columns, 8, 24)
  assert task.tokenizer.decode(target[0]) == "37*48?[1776]1776"
  np.testing.assert_array_equal(target_mask[0], [1] * 6 + [0] * 6 + [1] * 5 + [0] * 7)  # + the stop token
  np.testing.assert_array_equal(target_mask[1], [1] * 4 + [0] * 20)
  with pytest.raises(ValueError, match="env.max_episode_tokens"):
    sft_batch(task.tokenizer, columns, 8, 12)


def _load(preset):
  import importlib.util
  spec = importlib.util.spec_from_file_location("calculator_experiment", os.path.join(ROOT, "experiments",
                                                                                     "calculator.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)


@pytest.mark.parametrize("field,value,match", [
    ("env.name", "abacus", "unknown environment"),
    ("env.max_turns", 0, "env.max_turns"),
    ("env.max_episode_tokens", 4, "cannot hold one message"),
    ("task.tool_fraction", 1.5, "tool_fraction"),
])
def test_env_config_errors_name_the_field(field, value, match):
  c = _load("test")
  section, key = field.split(".")
  c[section][key] = value
  with pytest.raises(ValueError, match=match):
    checks.validate(c)


def test_context_must_hold_the_episode():
  c = _load("test")
  c.env.max_episode_tokens = 40
  with pytest.raises(ValueError, match="max_episode_tokens"):
    Settings.from_config(c).check_context(32, "model.max_position_embeddings")
