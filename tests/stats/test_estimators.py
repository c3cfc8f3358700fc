"""The per-prompt estimators against brute-force enumeration of every k-subset of the N samples."""
import itertools
import math

import numpy as np
import pytest

from grpo_jax.stats import estimators


def brute_pass_at_k(correct, k):
  subsets = list(itertools.combinations(range(len(correct)), k))
  return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def brute_maj_at_k(answers, correct, k):
  """The mean over k-subsets of the majority answer's correctness, ties split evenly, abstentions not voting."""
  value = {a: np.mean([c for b, c in zip(answers, correct) if b == a]) for a in set(answers) - {None}}
  total, subsets = 0.0, list(itertools.combinations(range(len(answers)), k))
  for s in subsets:
    votes = {}
    for i in s:
      if answers[i] is not None:
        votes[answers[i]] = votes.get(answers[i], 0) + 1
    if votes:
      top = max(votes.values())
      total += np.mean([value[a] for a, v in votes.items() if v == top])
  return total / len(subsets)


def random_prompt(rng):
  n = int(rng.integers(1, 11))
  kinds = int(rng.integers(1, 5))
  answers = [None if rng.random() < 0.2 else str(rng.integers(0, kinds)) for _ in range(n)]
  correct = [float(a == "0") for a in answers]  # the verifier is a function of the answer
  return answers, correct


def test_pass_at_k_equals_enumeration_on_random_prompts():
  rng = np.random.default_rng(0)
  for _ in range(300):
    answers, correct = random_prompt(rng)
    for k in range(1, len(correct) + 1):
      assert estimators.pass_at_k(len(correct), int(sum(correct)), k) == pytest.approx(
          brute_pass_at_k(correct, k), abs=1e-12)


def test_pass_at_k_by_hand_and_its_limits():
  # 2 right of 4, pass@2: 1 - C(2,2)/C(4,2) = 1 - 1/6
  assert estimators.pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
  assert estimators.pass_at_k(10, 0, 5) == 0.0 and estimators.pass_at_k(10, 6, 5) == 1.0
  assert estimators.pass_at_k(16, 3, 1) == pytest.approx(3 / 16)  # pass@1 is the mean correctness
  assert estimators.pass_at_k_P(np.array([[1, 0, 0, 0], [1, 1, 0, 0]]), 2) == pytest.approx([0.5, 5 / 6])
  with pytest.raises(ValueError, match="k <= the samples"):
    estimators.pass_at_k(4, 1, 5)


def test_maj_at_k_equals_enumeration_on_random_prompts():
  rng = np.random.default_rng(1)
  for _ in range(300):
    answers, correct = random_prompt(rng)
    for k in range(1, len(answers) + 1):
      assert estimators.maj_at_k(answers, correct, k) == pytest.approx(brute_maj_at_k(answers, correct, k),
                                                                        abs=1e-12), (answers, k)


def test_maj_at_k_with_partly_right_answers_equals_enumeration():
  """An answer's correctness is the mean over the samples that gave it (a verifier that reads more than it)."""
  rng = np.random.default_rng(2)
  for _ in range(100):
    n = int(rng.integers(2, 10))
    answers = [str(rng.integers(0, 3)) for _ in range(n)]
    correct = rng.integers(0, 2, n).astype(float)
    for k in (1, n // 2 or 1, n):
      assert estimators.maj_at_k(answers, correct, k) == pytest.approx(brute_maj_at_k(answers, correct, k),
                                                                        abs=1e-12)


def test_maj_at_k_by_hand():
  # a, a, b: maj@2 over {aa, ab, ab}: 1 + 1/2 + 1/2 of a's correctness 1 -> 2/3; maj@3: a wins
  assert estimators.maj_at_k(["a", "a", "b"], [1, 1, 0], 2) == pytest.approx(2 / 3)
  assert estimators.maj_at_k(["a", "a", "b"], [1, 1, 0], 3) == 1.0
  assert estimators.maj_at_k(["a", "a", "b"], [1, 1, 0], 1) == pytest.approx(2 / 3)  # maj@1 = pass@1
  assert estimators.maj_at_k([None, None], [0, 0], 2) == 0.0  # no votes
  assert estimators.maj_at_k([None, "x"], [0, 1], 2) == 1.0  # an abstention does not outvote
  # not the first k: the first two samples are (b, b), which would score 0
  assert estimators.maj_at_k(["b", "b", "a", "a", "a"], [0, 0, 1, 1, 1], 2) > 0.3


def test_maj_at_k_stays_fast_and_exact_for_64_samples():
  """64 distinct answers, one right: every 32-subset's vote is a 32-way tie, so maj@32 = P(the right answer is
  in the subset) / 32 = (32/64) / 32."""
  answers = [str(i) for i in range(64)]
  assert estimators.maj_at_k(answers, [1.0] + [0.0] * 63, 32) == pytest.approx(1 / 64, rel=1e-10)
  # two answers, 40 vs 24 votes: maj@k is the hypergeometric tail of the larger (plus half the ties)
  answers, correct = ["x"] * 40 + ["y"] * 24, [1.0] * 40 + [0.0] * 24
  k = 9
  tail = sum(math.comb(40, i) * math.comb(24, k - i) for i in range(5, k + 1)) / math.comb(64, k)
  assert estimators.maj_at_k(answers, correct, k) == pytest.approx(tail, rel=1e-12)


def test_avg_at_n_is_the_mean_score_with_partial_credit():
  scores = np.array([[1.0, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 0.1]])
  assert estimators.avg_at_n_P(scores) == pytest.approx([0.5, 0.025])
