"""Built-in verifiers bound their own cost: linear scans instead of backtracking regular expressions, checked
against those regular expressions on short random strings, and every built-in reward on 100k-character
adversarial completions (a cubic regex on one of them used to hold the GIL for minutes)."""
from __future__ import annotations

import math
import random
import re
import time

import pytest

from grpo_jax.rewards import answers, format_rewards, registry

N = 100_000
ADVERSARIAL = {
    "digits": "1" * N, "commas": "1," * (N // 2), "open_answers": "<answer>" * (N // 8),
    "open_boxes": "\\boxed{" * (N // 7), "braces": "{" * N, "parens": "(" * N + ")", "hashes": "####" * (N // 4),
    "unclosed_thinks": "<think>" * (N // 15) + "</think>" * (N // 16),
    "blank_answers": "<think></think><answer>" * (N // 23), "dollars": "$1" * (N // 2),
    "minus_run": "-" * N + "1", "fracs": "\\frac{" * (N // 6), "nested_expr": "(1+" * (N // 3),
}
COLUMNS = {"answer": ["15"], "numbers": [[1, 2, 3]], "target": [6], "completion_length": [10]}
try:  # the reasoning_gym reward's columns: one real item (the gym extra is in the test extra)
  from grpo_jax.data import reasoning_gym as _gym
  (_row,) = _gym.rows("reasoning_gym:basic_arithmetic", {}, seed=0, size=1)
  COLUMNS.update(gym_entry=[_row["gym_entry"]], gym_source=[_row["gym_source"]])
except ValueError:  # GymError: the extra is missing (the reward is then never configured)
  pass
# Seconds per call; the linear scans take milliseconds, the old regex took minutes on unclosed_thinks.
BOUND_S = 5.0


@pytest.mark.parametrize("name", [n for n in registry.list_rewards() if not n.startswith("math_verify")])
def test_builtin_rewards_are_fast_on_adversarial_completions(name):
  fn = registry.get_reward(name)
  for case, completion in ADVERSARIAL.items():
    start = time.perf_counter()
    (score,) = fn([""], [completion], **COLUMNS)
    elapsed = time.perf_counter() - start
    assert elapsed < BOUND_S, (case, elapsed)
    assert score is None or math.isfinite(score), (case, score)


_PIECES = ["<think>", "</think>", "<answer>", "</answer>", " ", "x", "7", "\n"]


def _random_strings(n=3000, seed=0):
  rng = random.Random(seed)
  return ["".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 12))) for _ in range(n)]


def test_answer_tag_content_equals_the_regex():
  regex = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
  for s in _random_strings():
    found = regex.findall(s)
    assert answers.answer_tag_content(s) == (found[-1] if found else None), s


def test_strict_format_equals_the_regex_with_counts():
  regex = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
  for s in _random_strings():
    m = regex.fullmatch(s)
    expected = m is not None and bool(m.group("answer").strip()) and all(s.count(t) == 1 for t in _PIECES[:4])
    assert format_rewards.strict_format_ok(s) == expected, s


def _lenient_reference(s: str) -> bool:
  """The documented rule by brute force: some <think> ... </think>, then later an answer block (an "<answer>"
  and the first "</answer>" after it) with non-blank content."""
  for i in [m.start() for m in re.finditer("<think>", s)]:
    for j in [m.start() for m in re.finditer("</think>", s) if m.start() >= i + 7]:
      for k in [m.start() for m in re.finditer("<answer>", s) if m.start() >= j + 8]:
        end = s.find("</answer>", k + 8)
        if end >= 0 and s[k + 8:end].strip():
          return True
  return False


def test_lenient_format_follows_its_rule():
  for s in _random_strings():
    assert format_rewards.lenient_format_ok(s) == _lenient_reference(s), s
  assert format_rewards.lenient_format_ok("<think>a</think><answer> </answer><answer>5</answer>")
  assert not format_rewards.lenient_format_ok("<answer>5</answer><think>a</think>")
