"""`train(config, workdir, reward_funcs=, train_dataset=, eval_dataset=, callbacks=)`: what a notebook hands a
run besides its config (grpo_jax/train/inputs.py), on the GSM8K recipe's :test preset."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

from grpo_jax import testing
from grpo_jax.train import loop
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.metrics import read_jsonl
from tests.train.conftest import ROOT


def short_answers(prompts, completions, **columns):
  """A reward defined in the notebook: 1 for completions under 20 characters."""
  assert "answer" in columns  # the dataset's other columns arrive as keyword lists
  return [float(len(c) < 20) for c in completions]


def _config():
  spec = importlib.util.spec_from_file_location("gsm8k_recipe", os.path.join(ROOT, "experiments", "gsm8k.py"))
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  config = recipe.get_config("test")
  config.task.train_path = ""  # the rows come from memory
  config.num_steps = 3
  return config


def test_reward_callables_datasets_in_memory_and_a_callback_that_stops(tmp_path):
  rows = testing.gsm8k_records()  # question / answer: the GSM8K layout, read like a file's rows
  train_rows, eval_rows = rows[:12], rows[12:]
  seen = []

  def stop_after_two(step, metrics):
    seen.append((step, metrics["rewards/short_answers/mean"]))
    return step == 2

  workdir = str(tmp_path / "run")
  summary = loop.train(_config(), workdir, reward_funcs=[short_answers], reward_weights=[0.5],
                       train_dataset=train_rows, eval_dataset=eval_rows, callbacks=[stop_after_two])
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [step for step, _ in seen] == [1, 2] and summary.steps == 2
  assert [r["step"] for r in records] == [0, 1, 2]
  assert [r["rewards/short_answers/mean"] for r in records[1:]] == [mean for _, mean in seen]
  assert "2" in os.listdir(os.path.join(workdir, "checkpoints"))  # the stop left a checkpoint to resume from
  with open(RunFiles(workdir).inputs) as f:
    assert json.load(f)["reward_funcs"] == ["short_answers"]

  # Other in-memory data cannot resume this run; the same inputs resume it to the end.
  with pytest.raises(ValueError, match="other in-memory inputs .train_dataset differ"):
    loop.train(_config(), workdir, reward_funcs=[short_answers], reward_weights=[0.5], train_dataset=rows[:11],
               eval_dataset=eval_rows)
  summary = loop.train(_config(), workdir, reward_funcs=[short_answers], reward_weights=[0.5],
                       train_dataset=train_rows, eval_dataset=eval_rows)
  assert summary.steps == 3
  assert [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == [0, 1, 2, 3]


def test_callbacks_keep_a_stop_an_earlier_hook_asked_for():
  from grpo_jax.train import hooks
  seen = []
  callbacks = hooks.Callbacks([lambda step, metrics: seen.append(step), lambda step, metrics: False])
  done = hooks.StepDone(step=3, state=None, rollout=None, metrics={}, stop=True)
  callbacks(done)
  assert done.stop and seen == [3]  # every callback ran; none asked to stop, the earlier stop stands
  done.stop = False
  hooks.Callbacks([lambda step, metrics: True])(done)
  assert done.stop


def test_bad_in_memory_inputs_are_named(tmp_path):
  with pytest.raises(ValueError, match="reward_weights has 2 entries for 1 reward_funcs"):
    loop.train(_config(), str(tmp_path / "a"), reward_funcs=[short_answers], reward_weights=[1.0, 2.0])
  with pytest.raises(ValueError, match="task.train_path='': the dataset task needs a data file"):
    loop.train(_config(), str(tmp_path / "b"))
  with pytest.raises(Exception, match=r"train_dataset, row 2: missing field 'answer'"):
    loop.train(_config(), str(tmp_path / "c"), train_dataset=[{"question": "q", "answer": "#### 1"},
                                                             {"question": "q"}])
