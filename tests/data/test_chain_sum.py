"""The chain_sum task (sums of single digits, answered bare or written out as running sums), its reward, the
warm start's demonstrations and the experiment file's test preset, run for 2 steps."""
from __future__ import annotations

import os

import numpy as np
import pytest

from grpo_jax.settings import Settings
from grpo_jax.data.synthetic import ChainSumTask
from grpo_jax.rewards.exact import final_field_match
from grpo_jax.train.warmstart import sft_batch
from grpo_jax.train import checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rows_are_sums_with_running_sum_demonstrations():
  task = ChainSumTask(min_terms=3, max_terms=8, seed=0, scratchpad_fraction=0.5)
  rows = task.train_rows(0, 400)
  counts, written = set(), 0
  for prompt, answer, demo in zip(rows["prompt"], rows["answer"], rows["demonstration"]):
    terms = [int(x) for x in prompt.rstrip("=").split("+")]
    counts.add(len(terms))
    assert all(0 <= t <= 9 for t in terms) and int(answer) == sum(terms)
    if "," in demo:
      written += 1
      assert [int(x) for x in demo.split(",")] == np.cumsum(terms)[1:].tolist()
    else:
      assert demo == answer
    assert len(demo) <= task.max_answer_chars and len(prompt) <= task.max_prompt_chars
  assert counts == set(range(3, 9))
  assert 150 < written < 250                       # about scratchpad_fraction of the rows
  assert rows == task.train_rows(0, 400)           # row i depends on (seed, i) only
  assert task.train_rows(200, 5)["prompt"] == rows["prompt"][200:205]
  assert ChainSumTask(seed=1).train_rows(0, 50)["prompt"] != rows["prompt"][:50]


def test_heldout_chains_never_appear_in_training_and_are_the_same_for_every_seed():
  a, b = ChainSumTask(seed=0), ChainSumTask(seed=5)
  heldout = a.eval_rows(200)
  assert heldout["prompt"] == b.eval_rows(200)["prompt"] and len(set(heldout["prompt"])) == 200
  train = set(a.train_rows(0, 5000)["prompt"])
  assert not train & set(heldout["prompt"])
  assert all(a.is_heldout([int(x) for x in p.rstrip("=").split("+")]) for p in heldout["prompt"])


def test_final_field_reward_reads_the_last_field():
  got = final_field_match(["1+2+3="] * 5, ["3,6", "6", "3,7", "", "3, 6 "], answer=["6"] * 5)
  assert got == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_warm_start_targets_are_the_demonstrations():
  task = ChainSumTask(seed=0, scratchpad_fraction=1.0)
  rows = task.train_rows(0, 4)
  _, _, target, mask = sft_batch(task.tokenizer, rows, max_prompt_length=16, max_new_tokens=24)
  for i, demo in enumerate(rows["demonstration"]):
    assert "," in demo
    assert task.tokenizer.decode(target[i, :mask[i].sum()].tolist()) == demo


@pytest.mark.parametrize("key, value, message", [
    ("task.max_terms", 13, "task.min_terms"), ("task.scratchpad_fraction", 1.5, "task.scratchpad_fraction"),
    ("sampling.max_new_tokens", 12, "sampling.max_new_tokens"), ("sampling.max_prompt_length", 10,
                                                                 "sampling.max_prompt_length")])
def test_config_errors_name_the_key(key, value, message):
  from tests.train.conftest import load_experiment
  c = load_experiment("chain_sum")()
  section, leaf = key.split(".")
  c[section][leaf] = value
  with pytest.raises(ValueError, match=message):
    checks.validate(c)


def test_the_test_preset_keeps_the_structure_and_trains_two_steps(tmp_path):
  from grpo_jax.train.loop import train
  from grpo_jax.persist.metrics import read_jsonl
  from tests.train.conftest import load_experiment
  full, tiny = load_experiment("chain_sum")(), load_experiment("chain_sum")("test")
  for key in ("task.name", "rewards", "eval.accuracy_reward", "warmstart.enabled", "grpo.beta", "grpo.advantage",
              "grpo.aggregation", "grpo.num_iterations", "model.remat", "model.dtype"):
    section, leaf = key.split(".") if "." in key else (None, key)
    get = (lambda c: c[section][leaf]) if section else (lambda c: c[leaf])
    assert get(full) == get(tiny), key
  # Several updates per rollout batch in both (the clip range acts).
  for c in (tiny, full):
    settings = Settings.from_config(c)
    assert settings.rollout_batch_size // settings.mini_batch_size > 1
  summary = train(tiny, str(tmp_path))
  records = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if r["step"] >= 1]
  assert [r["step"] for r in records] == [1, 2] and summary.steps == 2
  assert all("completions/mean_length" in r and "clip_ratio/high" in r for r in records)
  assert any("completions/mean_length_incorrect" in r for r in records)
