"""word_arithmetic's few-shot style (base models, the plain template) and the first_line_match reward."""
from __future__ import annotations

import re

from grpo_jax.data import word_arithmetic
from grpo_jax.rewards import get_reward


def test_few_shot_prompts_hold_only_training_pairs_and_the_split_is_the_question_styles():
  train, heldout = word_arithmetic.split(2, 0.05, "few_shot")
  q_train, q_heldout = word_arithmetic.split(2, 0.05)
  assert [(r["a"], r["b"]) for r in heldout] == [(r["a"], r["b"]) for r in q_heldout]
  assert len(train) == len(q_train)
  held = {(r["a"], r["b"]) for r in heldout}
  examples = [tuple(map(int, m)) for m in re.findall(r"(\d+) \+ (\d+) = (\d+)", word_arithmetic.FEW_SHOT)]
  assert len(examples) == 3
  for a, b, s in examples:
    assert a + b == s and (a, b) not in held and (b, a) not in held
  row = heldout[0]
  assert row["prompt"] == f"{word_arithmetic.FEW_SHOT}{row['a']} + {row['b']} ="
  assert q_heldout[0]["prompt"] == f"What is {row['a']} + {row['b']}?"


def test_first_line_match_scores_the_first_line_only():
  reward = get_reward("first_line_match")
  completions = [" 82\n13 + 4 = 17", " 82", "82 ", " 8", " 28\n82", ""]
  assert reward([""] * 6, completions, answer=["82"] * 6) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
