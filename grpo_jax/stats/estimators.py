"""Per-prompt estimators from N sampled completions of each prompt, exact and unbiased where one exists.

For one prompt with N samples, each with a score s (the accuracy reward, partial credit allowed), correctness
c = (s >= 1) and an extracted answer a (None when the completion has none):

  avg@N  = mean of the N scores: an unbiased estimate of the expected score of one sample.
  pass@k = P(at least one of k samples drawn without replacement from the N is correct)
         = 1 - C(N - C, k) / C(N, k), with C the number correct (Chen et al. 2021, "Evaluating Large Language
           Models Trained on Code", eq. 1): unbiased for the pass@k of k fresh samples; k <= N.
  maj@k  = the mean, over all C(N, k) subsets of k of the N samples, of the correctness of the subset's majority
           answer; not the first k samples, which would add the noise of one arbitrary subset. Tie rule: when
           several answers share the most votes, the winner is drawn uniformly among them (counted in
           expectation: a tie between a right and a wrong answer scores 1/2). Samples without an answer do not
           vote; a subset with no votes scores 0. An answer's correctness is the mean correctness of the samples
           that gave it (the same for all of them when the verifier is a function of the answer).

A figure over prompts is the mean of its per-prompt values; intervals.py puts an interval on it.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Sequence

import numpy as np


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """Chen et al.'s unbiased pass@k of one prompt: 1 - C(n - c, k) / C(n, k), as a stable product."""
  n, c = int(num_samples), int(num_correct)
  if not 1 <= k <= n:
    raise ValueError(f"pass@{k} needs 1 <= k <= the samples per prompt ({n})")
  if not 0 <= c <= n:
    raise ValueError(f"{c} correct of {n} samples")
  if n - c < k:
    return 1.0
  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_P(correct_PxN: np.ndarray, k: int) -> np.ndarray:
  """[P] pass@k of each prompt from its N samples' correctness (bool or 0/1)."""
  correct_PxN = np.asarray(correct_PxN, bool)
  n = correct_PxN.shape[1]
  return np.asarray([pass_at_k(n, c, k) for c in correct_PxN.sum(axis=1)], np.float64)


def avg_at_n_P(scores_PxN: np.ndarray) -> np.ndarray:
  """[P] mean score of each prompt's N samples."""
  return np.asarray(scores_PxN, np.float64).mean(axis=1)


def _answer_classes(answers: Sequence[Hashable | None], correct: Sequence[float]):
  """(counts [m], values [m], abstentions): the distinct non-None answers, how many samples gave each and the
  mean correctness of those samples, and the number of samples without an answer."""
  votes: dict[Hashable, list[float]] = defaultdict(list)
  abstain = 0
  for answer, right in zip(answers, correct, strict=True):
    if answer is None:
      abstain += 1
    else:
      votes[answer].append(float(right))
  counts = np.asarray([len(v) for v in votes.values()], np.int64)
  values = np.asarray([np.mean(v) for v in votes.values()], np.float64)
  return counts, values, abstain


def _binomial_row(n: int, top: int) -> np.ndarray:
  """[top+1] C(n, y) for y = 0..top (zero beyond n)."""
  return np.asarray([math.comb(n, y) for y in range(top + 1)], np.float64)


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[float], k: int) -> float:
  """maj@k of one prompt (module docstring), exactly: the sum over k-subsets is a coefficient of a product of
  per-answer generating polynomials.

  For a vote count x, answer i contributes A_i(z) = sum_{y<x} C(c_i, y) z^y when it stays below x and
  B_i(z) = C(c_i, x) z^x when it ties at x. The subsets whose top count is x, weighted by the winner's expected
  correctness 1/|T| sum_{j in T} v_j over the tied set T, add up to the z^k coefficient of
  integral_0^1 d/de prod_i (A_i + u B_i + e v_i B_i) du at e = 0 (since 1/(1+t) = integral of u^t), times the
  abstentions' (1+z)^c0. The derivative is carried as a dual number and the integral is Gauss-Legendre, exact
  for the polynomial in u. Answers with fewer than x votes contribute (1+z)^{c_i} and are merged."""
  counts, values, abstain = _answer_classes(answers, correct)
  n = int(counts.sum()) + abstain
  if not 1 <= k <= n:
    raise ValueError(f"maj@{k} needs 1 <= k <= the samples per prompt ({n})")
  if counts.size == 0:
    return 0.0
  total = 0.0
  for x in range(1, min(k, int(counts.max())) + 1):
    at_x = counts >= x
    below = abstain + int(counts[~at_x].sum())
    base = _binomial_row(below, k)
    degree = k // x - 1  # in u: at most k // x answers reach x, one of them the winner
    nodes, weights = np.polynomial.legendre.leggauss(degree // 2 + 1)
    u, w = (nodes + 1) / 2, weights / 2
    poly = np.tile(base, (u.size, 1))        # [Q, k+1]: prod_i (A_i + u B_i), over the answers so far
    dual = np.zeros_like(poly)              # its derivative in e
    for c_i, v_i in zip(counts[at_x], values[at_x]):
      f = np.zeros((u.size, x + 1))
      f[:, :x] = _binomial_row(int(c_i), x - 1)
      b = float(math.comb(int(c_i), x))
      f[:, x] = u * b
      g_x = v_i * b  # e's coefficient: v_i B_i, a single term at z^x
      new_poly, new_dual = np.zeros_like(poly), np.zeros_like(dual)
      for y in range(x + 1):
        new_poly[:, y:] += f[:, y:y + 1] * poly[:, :k + 1 - y]
        new_dual[:, y:] += f[:, y:y + 1] * dual[:, :k + 1 - y]
      new_dual[:, x:] += g_x * poly[:, :k + 1 - x]
      poly, dual = new_poly, new_dual
    total += float(w @ dual[:, k])
  return total / math.comb(n, k)


def maj_at_k_P(answers_PxN: Sequence[Sequence[Hashable | None]], correct_PxN: np.ndarray, k: int) -> np.ndarray:
  """[P] maj@k of each prompt."""
  return np.asarray([maj_at_k(a, c, k) for a, c in zip(answers_PxN, np.asarray(correct_PxN), strict=True)],
                    np.float64)
