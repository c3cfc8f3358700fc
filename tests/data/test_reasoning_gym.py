"""reasoning-gym tasks (grpo_jax/data/reasoning_gym.py) and their reward (grpo_jax/rewards/reasoning_gym.py)."""
from __future__ import annotations

import re
import sys
import time

import pytest

pytest.importorskip("reasoning_gym")

from grpo_jax import config as config_lib  # noqa: E402
from grpo_jax.data import reasoning_gym as gym  # noqa: E402
from grpo_jax.rewards import reasoning_gym as gym_reward  # noqa: E402
from grpo_jax.rewards import score_completions  # noqa: E402
from grpo_jax.train import checks  # noqa: E402

# One dataset per reasoning-gym family: arithmetic, algebra, logic, algorithmic, graphs, games, cognition,
# probability, geometry, induction, code.
DATASETS = ("basic_arithmetic", "simple_equations", "syllogism", "spell_backward", "shortest_path", "maze",
            "rectangle_count", "coin_flip", "simple_geometry", "list_functions", "bf")


# A wrong answer per dataset where another item's answer is not wrong enough: these verifiers give partial
# credit to a number close to the gold one (coin_flip: 0.4 for a probability of the right magnitude).
WRONG = {"rectangle_count": "987654", "coin_flip": "7"}


def _split(name, train_size=200, heldout_size=40, options=None):
  return gym.split(gym.PREFIX + name, options or {}, train_seed=1, train_size=train_size, heldout_seed=1_000_000,
                   heldout_size=heldout_size)


def _score(rows, completions):
  return gym_reward.reasoning_gym_score([r["prompt"] for r in rows], completions,
                                        gym_entry=[r["gym_entry"] for r in rows],
                                        gym_source=[r["gym_source"] for r in rows])


@pytest.mark.parametrize("name", DATASETS)
def test_gold_answer_scores_one_and_another_items_answer_zero(name):
  rows = _split(name, train_size=30, heldout_size=30).heldout
  row = rows[0]
  wrong = WRONG.get(name) or next(r["answer"] for r in rows[1:] if r["answer"].strip() != row["answer"].strip())
  completions = [f"<think>working</think>\n<answer> {row['answer']} </answer>",   # whitespace stripped
                 f"<answer>{wrong}</answer>",
                 row["answer"]]                                                  # no tags: no answer
  assert _score([row] * 3, completions) == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("name", DATASETS + ("coin_flip",))
def test_no_heldout_question_is_a_training_question(name):
  data = _split(name)
  train = {r["prompt"] for r in data.train}
  assert not train & {r["prompt"] for r in data.heldout}
  assert len(data.heldout) + data.num_duplicates == 40 and len(data.train) == 200


def test_small_generators_repeat_and_the_repeats_are_dropped_and_counted():
  # 2 one-digit terms: few distinct questions, so most held-out items are also training items.
  data = _split("basic_arithmetic", options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
  assert data.num_duplicates > 0 and len(data.heldout) == 40 - data.num_duplicates


def test_options_pass_through_and_composite_scores_each_item_with_its_dataset():
  rows = _split("leg_counting", 20, 5, {"min_animals": 1, "max_animals": 1}).train
  assert all(r["gym_entry"]["metadata"]["num_animals"] == 1 for r in rows)
  options = {"datasets": {"chain_sum": 1.0, "leg_counting": {"weight": 3.0, "config": {"min_animals": 1, "max_animals": 2}}}}
  rows = _split("composite", 60, 10, options).train
  sources = [r["gym_entry"]["metadata"]["source_dataset"] for r in rows]
  assert 0 < sources.count("chain_sum") < sources.count("leg_counting")
  assert all(r["gym_entry"]["metadata"]["num_animals"] <= 2 for r in rows if "num_animals" in
             r["gym_entry"]["metadata"])
  assert _score(rows, [f"<answer>{r['answer']}</answer>" for r in rows]) == [1.0] * len(rows)


def test_extract_answer_agrees_with_reasoning_gym():
  from reasoning_gym.utils import extract_answer
  cases = ["<answer>5</answer>", "a <answer> 5 </answer> b <answer>\n7\n</answer>", "<answer>5", "none",
           "<answer></answer>", "<answer>1</answer><answer>2", "<answer>a\nb</answer>"]
  for text in cases:
    assert gym_reward.extract_answer(text) == extract_answer(text), text


def _config(name="reasoning_gym:leg_counting", **task):
  c = config_lib.get_config()
  c.model.hf_path = "/nonexistent"   # validation only checks that one is given
  c.task.name = name
  c.task.template = "chat"
  c.task.train_size, c.task.heldout_size = 100, 20
  c.rewards = {"reasoning_gym": 1.0}
  c.eval.accuracy_reward = "reasoning_gym"
  for key, value in task.items():
    c.task[key] = value
  return c


# _config's reasoning_gym keys back at their defaults: an addition task refuses any it does not read.
_ADDITION = dict(template="plain", train_size=10000, heldout_size=500)


@pytest.mark.parametrize("task, message", [
    (dict(name="reasoning_gym:leg_countin"), "config.task.name: 'reasoning_gym:leg_countin' is not a reasoning-gym "
                                             "dataset; did you mean reasoning_gym:leg_counting"),
    (dict(options={"min_animal": 2}), "config.task.options.min_animal: not an option of reasoning_gym:leg_counting "
                                      "(did you mean 'min_animals'?)"),
    (dict(options={"min_animals": 3, "max_animals": 2}), "config.task.options: reasoning_gym:leg_counting rejects"),
    (dict(options={"seed": 3}), "config.task.options.seed: set config.task.train_seed"),
    (dict(heldout_seed=50), "config.task.heldout_seed: 50 is within 122 of task.train_seed=1"),
    (dict(name="reasoning_gym:composite", options={"datasets": {"chain_sum": -1.0}}),
     "config.task.options.datasets.chain_sum.weight: must be a positive number"),
    (dict(name="addition", options={"x": 1}, **_ADDITION),
     "config.task.options: only reasoning_gym tasks take options"),
    (dict(name="addition", answer_only=True, **_ADDITION),
     "config.task.answer_only=True: only reasoning_gym tasks have an answer-only"),
])
def test_config_errors_name_key_and_fix(task, message):
  with pytest.raises(ValueError, match="^" + re.escape(message)):
    checks.validate(_config(**task))


def test_missing_extra_is_one_line_naming_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "reasoning_gym", None)   # import reasoning_gym raises ImportError
  with pytest.raises(ValueError) as info:
    checks.validate(_config())
  assert "pip install -e '.[gym]'" in str(info.value) and "\n" not in str(info.value)


def test_raising_verifier_scores_fallback_and_is_counted_in_the_worker_process():
  rows = _split("prime_factorization", 10, 3).heldout[:2]
  # prime_factorization's verifier raises ValueError on an answer that is not a product of integers.
  completions = [f"<answer>{rows[0]['answer']}</answer>", "<answer>not a number</answer>"]
  result = score_completions([("reasoning_gym", "reasoning_gym", 1.0)], [r["prompt"] for r in rows], completions,
                             {k: [r[k] for r in rows] for k in ("gym_entry", "gym_source")}, timeout_s=30.0,
                             isolation="process")
  assert result.per_fn["reasoning_gym"].tolist() == [1.0, 0.0]
  assert result.failures["reasoning_gym"] == 1


class _HangingDataset:
  def score_answer(self, answer, entry):
    if answer == "hang":
      time.sleep(5)
    return 1.0


def test_hanging_verifier_times_out_scores_fallback_and_is_counted(monkeypatch):
  rows = _split("basic_arithmetic", 10, 3).heldout[:2]
  monkeypatch.setitem(gym_reward._SCORERS, rows[0]["gym_source"], _HangingDataset())
  start = time.perf_counter()
  result = score_completions([("reasoning_gym", "reasoning_gym", 1.0)], ["q", "q"],
                             ["<answer>hang</answer>", "<answer>1</answer>"],
                             {k: [r[k] for r in rows] for k in ("gym_entry", "gym_source")}, timeout_s=0.3,
                             isolation="thread")   # the stand-in verifier lives in this process only
  assert result.per_fn["reasoning_gym"].tolist() == [0.0, 1.0]
  assert result.failures["reasoning_gym"] == 1
  assert time.perf_counter() - start < 3


@pytest.mark.parametrize("completion, answer", [
    (" 12</answer>", "12"), ("\n\nThe answer is 7.", "7"), ("\n\nThe answer is True. Two strings are", "True"),
    ('\nAnswer: "nus".\nmore', "nus"), ("3.5\n", "3.5"), ("\n\n", None), ("</answer> 4", None),
    ("\n\nthe final answer is: Yes\n</answer>", "Yes"), (" = 6\nThe answer is: 6", "6"), ("\nq = 14", "14"),
    (" 4 + 5 = 9.", "9"), ("2 + 3 =\n5", None)])
def test_answer_only_extraction_takes_the_first_sentence_before_the_closing_tag(completion, answer):
  assert gym_reward.extract_answer_only(completion) == answer


def test_answer_only_rows_score_the_line_the_model_writes_after_the_prefilled_tag():
  rows = _split("basic_arithmetic", 50, 10, {"min_terms": 2, "max_terms": 2, "max_digits": 1}).heldout
  answer_only = gym.split(gym.PREFIX + "basic_arithmetic", {"min_terms": 2, "max_terms": 2, "max_digits": 1},
                          train_seed=1, train_size=50, heldout_seed=1_000_000, heldout_size=10, answer_only=True)
  assert all(r["gym_answer_only"] for r in answer_only.heldout) and not any(r["gym_answer_only"] for r in rows)
  rows = answer_only.heldout[:2]
  gold = [f"\n\nThe answer is {r['answer']}." for r in rows]
  wrong = [f" {int(r['answer']) + 1}</answer>" for r in rows]
  columns = dict(gym_entry=[r["gym_entry"] for r in rows], gym_source=[r["gym_source"] for r in rows],
                 gym_answer_only=[r["gym_answer_only"] for r in rows])
  assert gym_reward.reasoning_gym_score(["q"] * 2, gold, **columns) == [1.0, 1.0]
  assert gym_reward.reasoning_gym_score(["q"] * 2, wrong, **columns) == [0.0, 0.0]
  # A line that ends in "= answer" answers that value (the verifier alone pays len(answer) / len(line) for it).
  equation = [f" {r['answer']} + 0 = {r['answer']}\n" for r in rows]
  assert gym_reward.reasoning_gym_score(["q"] * 2, equation, **columns) == [1.0, 1.0]
  # Partial credit: the verifier pays len(answer) / len(line) for a line that contains the answer; full credit 0.
  inside = [f" {r['answer']}{r['answer']}\n" for r in rows]
  assert gym_reward.reasoning_gym_score(["q"] * 2, inside, **columns) == [0.5, 0.5]
  assert gym_reward.reasoning_gym_full_credit(["q"] * 2, inside, **columns) == [0.0, 0.0]
  assert gym_reward.reasoning_gym_full_credit(["q"] * 2, gold, **columns) == [1.0, 1.0]
  # The same completions in the tag convention have no complete <answer> pair: no answer, 0.
  assert _score(rows, gold) == [0.0, 0.0]


def test_answer_only_prompts_end_in_the_prefill_and_sampling_stops_at_the_closing_tag():
  from grpo_jax import testing
  from grpo_jax.data.templates import tokenize_prompts
  tokenizer = testing.build_tokenizer()
  kept, _ = tokenize_prompts([{"prompt": "2 + 3 ="}], tokenizer, 192, template="chat", system_prompt="s",
                             prefill=gym.ANSWER_PREFILL)
  assert kept[0]["prompt_text"].endswith("assistant\n<answer>")
  ids = gym.closing_tag_ids(tokenizer)
  assert ids and all("</" in tokenizer.decode([i]) for i in ids)
  encoded = tokenizer("x</answer>", add_special_tokens=False)["input_ids"]
  assert any(i in ids for i in encoded)


def test_constant_answer_is_the_best_single_answer_by_the_datasets_own_verifier():
  import collections
  import reasoning_gym
  rows = _split("aiw", 50, 80).heldout
  columns = {k: [r[k] for r in rows] for k in ("prompt", "answer", "gym_entry", "gym_source")}
  answer, score = gym.constant_answer(columns)
  dataset = reasoning_gym.create_dataset("aiw", seed=1, size=1)   # its score_answer, called directly
  brute = {a: sum(dataset.score_answer(a, e) for e in columns["gym_entry"]) / len(rows)
           for a in set(columns["answer"])}
  assert score == pytest.approx(max(brute.values())) and brute[answer] == pytest.approx(score)
  share = collections.Counter(columns["answer"]).most_common(1)[0][1] / len(rows)
  assert score >= share and score < 1
  assert gym.constant_answer({"prompt": ["q"], "answer": ["1"]}) is None   # not reasoning-gym rows
  # The task's plug-in gives it by the accuracy reward's measure (what training logs and grpo-evaluate prints).
  import types
  from grpo_jax.data import tasks
  def settings(reward):
    return types.SimpleNamespace(task=types.SimpleNamespace(name="reasoning_gym:aiw"),
                                 eval=types.SimpleNamespace(accuracy_reward=reward))
  assert tasks.constant_answer(settings("reasoning_gym"), columns) == (answer, pytest.approx(score))
  # By full credit alone, the best constant is the most frequent answer, scoring its share.
  assert gym.constant_answer(columns, full_credit=True) == (collections.Counter(columns["answer"]).most_common(1)[0][0],
                                                            pytest.approx(share))
  assert tasks.constant_answer(settings(gym.FULL_CREDIT_REWARD), columns)[1] == pytest.approx(share)

