"""The Tunix-demo rewards of grpo_jax/rewards/reasoning_tags.py: hand-checked cases, and the linear scans against
the regular expressions that state the demo's rules, on random strings of tags, digits and line breaks."""
from __future__ import annotations

import random
import re

import pytest

from grpo_jax.rewards import get_reward
from grpo_jax.rewards.reasoning_tags import first_number_after_answer, formatted_answer

GOOD = "<reasoning>6 * 7 = 42</reasoning>\n<answer>42</answer>"


@pytest.mark.parametrize("completion,fmt,tags,graded,number", [
    (GOOD, 1.0, 2.5, 3.0, 1.0),
    ("<reasoning>x</reasoning><answer> 42 </answer>", 1.0, 2.5, 1.5, 1.0),
    ("<reasoning>x</reasoning><answer>42.0</answer>", 1.0, 2.5, 0.5, 1.0),      # equal as numbers only
    ("<reasoning>x</reasoning><answer>40</answer>", 1.0, 2.5, 0.5, 0.0),        # within 10%
    ("<reasoning>x</reasoning><answer>35</answer>", 1.0, 2.5, 0.25, 0.0),       # within 20%
    ("<reasoning>x</reasoning><answer>7</answer>", 1.0, 2.5, -1.0, 0.0),
    ("<reasoning>x</reasoning><answer>forty-two</answer>", 1.0, 2.5, -0.5, 0.0),
    ("<reasoning>x</reasoning><answer>It is 42 apples</answer>", 1.0, 2.5, -0.5, 1.0),
    ("Sure.\n  <reasoning>x</reasoning><answer>42</answer>  \nDone.", 1.0, 1.5, 3.0, 1.0),  # lines around it
    ("Sure. <reasoning>x</reasoning><answer>42</answer>", 0.0, 1.5, 0.0, 1.0),    # text before, same line
    ("<reasoning>x</reasoning><answer>42</answer> ok", 0.0, 2.5, 0.0, 1.0),       # text after, same line
    ("<reasoning></reasoning><answer>42</answer>", 0.0, 2.5, 0.0, 1.0),           # empty reasoning
    ("<reasoning>x</reasoning><answer>42", 0.0, 1.5, 0.0, 1.0),                   # answer never closed
    ("The answer is 42.", 0.0, -2.5, 0.0, 0.0),
    ("", 0.0, -2.5, 0.0, 0.0),
])
def test_the_demo_scores(completion, fmt, tags, graded, number):
  def score(name):
    return get_reward(name)([""], [completion], answer=["42"])[0]
  assert score("reasoning_format") == fmt
  assert score("reasoning_format_tags") == tags
  assert score("reasoning_answer_graded") == graded
  assert score("reasoning_answer_number") == number


def test_gold_may_be_a_full_gsm8k_answer_and_zero_is_not_a_ratio():
  answer = get_reward("reasoning_answer_graded")
  assert answer([""], [GOOD], answer=["6 * 7 = 42\n#### 42"]) == [3.0]
  assert answer([""], ["<reasoning>x</reasoning><answer>1</answer>"], answer=["0"]) == [-0.5]
  assert get_reward("reasoning_answer_number")([""], ["<answer>0</answer>"], answer=["0"]) == [1.0]


_PIECES = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", " ", "\n", "x", "4", "2", "."]


def _random_strings(n=4000, seed=0):
  rng = random.Random(seed)
  return ["".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 14))) for _ in range(n)]


def test_format_scan_equals_the_demo_regex():
  regex = re.compile(r"^[\s]{0,}<reasoning>.+?</reasoning>.*?<answer>(.+?)</answer>[\s]{0,}$",
                     flags=re.MULTILINE | re.DOTALL)
  for s in _random_strings():
    m = regex.search(s)
    assert formatted_answer(s) == (m.group(1) if m else None), repr(s)


def test_number_scan_equals_the_demo_regex():
  regex = re.compile(r"<answer>.*?([\d\.]{1,})", flags=re.MULTILINE | re.DOTALL)
  for s in _random_strings():
    m = regex.search(s)
    assert first_number_after_answer(s) == (m.group(1) if m else None), repr(s)
