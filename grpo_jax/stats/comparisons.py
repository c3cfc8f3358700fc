"""Comparisons of groups of runs: paired differences by seed, Holm's adjustment, the probability of improvement,
and the two-level bootstrap that splits an interval's width between seeds and held-out prompts.

  paired       the differences (variant - baseline) of members with the same seed (same warm start, same data
               order): their mean, Student's t interval, the two-sided p value of a one-sample t test against 0
               (scipy.stats.ttest_1samp; None when all differences are equal) and the number of seeds where the
               variant is higher.
  holm         Holm's step-down adjustment of the p values of one table's comparisons (family-wise error <= alpha;
               scipy.stats has Benjamini-Hochberg but not Holm).
  improvement  P(the variant scores higher than the baseline on the same seed), ties counting 1/2: the paired
               form of Agarwal et al. 2021's ("Deep RL at the edge of the statistical precipice") U / (n m), with
               a percentile bootstrap over the pairs.
  two_level    members evaluated on the same held-out prompts: resample seeds, then prompts (one draw of prompt
               indices shared by all seeds of a replicate, since they share the prompt set); the percentile
               interval of the mean, and how much of its variance comes from the seeds (prompts held fixed) and
               how much from the prompts (seeds held fixed).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np
from scipy import stats

from grpo_jax.stats.intervals import LEVEL, NO_INTERVAL, Interval, over_seeds

RESAMPLES = 4_000


class Paired(NamedTuple):
  mean: float
  interval: Interval
  p: float | None  # None: the differences have no spread (all equal), so no test; NaN: fewer than 2
  n: int
  wins: int


def paired(differences: Sequence[float], level: float = LEVEL) -> Paired:
  """Mean, t interval, two-sided p value and wins of same-seed differences (finite ones); no p (None) and no
  interval when the differences are all equal: a t test has no spread to measure them against."""
  d = np.asarray([v for v in differences if math.isfinite(v)], np.float64)
  if d.size == 0:
    return Paired(math.nan, NO_INTERVAL, math.nan, 0, 0)
  if d.size >= 2 and np.ptp(d) <= 1e-12 * max(1.0, abs(float(d.mean()))):  # no spread (up to rounding)
    return Paired(float(d.mean()), NO_INTERVAL, None, int(d.size), int((d > 0).sum()))
  p = float(stats.ttest_1samp(d, 0.0).pvalue) if d.size >= 2 else math.nan
  return Paired(float(d.mean()), over_seeds(d, level), p, int(d.size), int((d > 0).sum()))


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm-adjusted p values, in the input's order (NaN stays NaN and is not counted)."""
  p = np.asarray(p_values, np.float64)
  finite = np.flatnonzero(np.isfinite(p))
  adjusted = np.full(p.shape, np.nan)
  order = finite[np.argsort(p[finite], kind="stable")]
  m, running = order.size, 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[i]))
    adjusted[i] = running
  return adjusted.tolist()


def improvement(differences: Sequence[float], level: float = LEVEL) -> tuple[float, Interval]:
  """(probability of improvement, its percentile bootstrap interval over the pairs) from same-seed differences
  (variant - baseline, finite ones): the share of pairs where the variant is higher, ties counting 1/2. Agarwal et
  al.'s U / (n m) counts every run of the variant against every run of the baseline, as if seeds were independent;
  this counts each variant run against the baseline run with its seed only."""
  wins = np.asarray([(v > 0) + (v == 0) / 2 for v in differences if math.isfinite(v)], np.float64)
  if wins.size < 2:
    return (float(wins.mean()) if wins.size else math.nan), NO_INTERVAL
  result = stats.bootstrap((wins,), np.mean, vectorized=True, confidence_level=level, n_resamples=RESAMPLES,
                           method="percentile", rng=np.random.default_rng(0))
  return float(wins.mean()), Interval(float(result.confidence_interval.low), float(result.confidence_interval.high),
                                      "percentile bootstrap")


class TwoLevel(NamedTuple):
  mean: float
  interval: Interval
  seed_sd: float     # the mean's standard error from resampling seeds alone
  prompt_sd: float   # ... and from resampling prompts alone
  seed_share: float  # seed_sd^2 / (seed_sd^2 + prompt_sd^2)


def _resample_weights(rng, replicates: int, n: int) -> np.ndarray:
  """[replicates, n] how often each unit is drawn in a resample of n units with replacement, / n."""
  draws = rng.integers(0, n, size=(replicates, n))
  return np.stack([np.bincount(row, minlength=n) for row in draws]).astype(np.float64) / n


def two_level(scores_SxP: np.ndarray, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> TwoLevel:
  """The two-level bootstrap of the mean of `scores_SxP` (a per-prompt score of each seed's run on the same
  prompts; for paired differences, variant minus baseline per seed and prompt)."""
  x = np.asarray(scores_SxP, np.float64)
  S, P = x.shape
  if S == 0 or P == 0:
    return TwoLevel(math.nan, NO_INTERVAL, math.nan, math.nan, math.nan)
  rng = np.random.default_rng(seed)
  seeds, prompts = _resample_weights(rng, resamples, S), _resample_weights(rng, resamples, P)
  both = np.einsum("bs,sp,bp->b", seeds, x, prompts)
  seed_only = seeds @ x.mean(axis=1)
  prompt_only = prompts @ x.mean(axis=0)
  alpha = (1 - level) / 2
  lo, hi = np.quantile(both, [alpha, 1 - alpha])
  seed_sd, prompt_sd = float(seed_only.std(ddof=1)), float(prompt_only.std(ddof=1))
  total = seed_sd ** 2 + prompt_sd ** 2
  return TwoLevel(float(x.mean()), Interval(float(lo), float(hi), "two-level bootstrap"), seed_sd, prompt_sd,
                  seed_sd ** 2 / total if total > 0 else math.nan)
