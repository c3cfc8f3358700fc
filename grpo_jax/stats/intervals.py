"""95% intervals, each with the name of its method, over prompts (one evaluation) and over seeds (a group of runs).

Over prompts, the unit of resampling is the prompt: a prompt's N samples stay together, since they share its
difficulty.
  wilson     a 0/1 score per prompt (greedy accuracy of a 0/1 verifier): Wilson's score interval (Newcombe
             1998's closed form, scipy.stats.binomtest(...).proportion_ci's), which keeps its coverage near 0
             and 1 where the normal one does not.
  bca        anything else (partial credit, avg@N, pass@k, maj@k): the mean over prompts with a BCa bootstrap
             over prompts (scipy.stats.bootstrap, 9,999 resamples, a fixed seed so a figure is reproducible).
             When every prompt has the same value there is nothing to resample: the interval is that value.
Over seeds:
  t          Student's t interval of the mean of the seeds' values (scipy.stats.t). A bootstrap over 3-5 seeds
             under-covers (its resamples cannot show more spread than the seeds have), while the t interval is
             exact for a normal seed-to-seed spread; tests/stats/test_coverage.py measures both.

scipy is imported by the methods that need it: every evaluation of a training run takes a Wilson interval, and
scipy.stats alone took 0.5 s of the 2.4 s a trainer spends importing (2-core VM).
"""
from __future__ import annotations

import math
import statistics
from typing import NamedTuple

import numpy as np

LEVEL = 0.95
RESAMPLES = 9_999


class Interval(NamedTuple):
  lo: float
  hi: float
  method: str


NO_INTERVAL = Interval(math.nan, math.nan, "none")


def wilson_center_half(n: int, p: float, level: float = LEVEL) -> tuple[float, float]:
  """(center, half-width) of Wilson's interval at n trials and an observed proportion p, any p in [0, 1]."""
  z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
  denom = 2 * (n + z * z)
  return (2 * n * p + z * z) / denom, z * math.sqrt(4 * n * p * (1 - p) + z * z) / denom


def wilson(successes: int, trials: int, level: float = LEVEL) -> Interval:
  """Wilson's score interval of a proportion."""
  if trials <= 0:
    return NO_INTERVAL
  center, half = wilson_center_half(trials, successes / trials, level)
  return Interval(0.0 if successes == 0 else center - half, 1.0 if successes == trials else center + half, "wilson")


def bootstrap_mean(values: np.ndarray, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
  """BCa bootstrap interval of the mean of `values` (one value per resampled unit)."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    return NO_INTERVAL
  if np.ptp(x) == 0:  # nothing varies: BCa is undefined, and every resample gives this value
    return Interval(float(x[0]), float(x[0]), "bca")
  from scipy import stats
  result = stats.bootstrap((x,), np.mean, confidence_level=level, n_resamples=resamples, method="BCa",
                           vectorized=True, rng=np.random.default_rng(seed))
  return Interval(float(result.confidence_interval.low), float(result.confidence_interval.high), "bca")


def over_prompts(values_P: np.ndarray, level: float = LEVEL) -> Interval:
  """The interval of the mean over prompts of a per-prompt value: Wilson when every value is 0 or 1, else BCa."""
  x = np.asarray(values_P, np.float64)
  if x.size and np.all((x == 0) | (x == 1)):
    return wilson(int(x.sum()), x.size, level)
  return bootstrap_mean(x, level)


def t_half_width(std, n, level: float = LEVEL):
  """The half-width of Student's t interval of a mean, from the sample std (ddof=1) and the count; elementwise
  over arrays (a report's band at every step), NaN where n < 2."""
  from scipy import stats
  n = np.asarray(n, np.float64)
  return np.where(n > 1, stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * std / np.sqrt(n), np.nan)


def over_seeds(values_S: np.ndarray, level: float = LEVEL) -> Interval:
  """Student's t interval of the mean over seeds (finite values only); none for fewer than two."""
  x = np.asarray([v for v in np.asarray(values_S, np.float64) if math.isfinite(v)])
  if x.size < 2:
    return NO_INTERVAL
  half = float(t_half_width(x.std(ddof=1), x.size, level))
  return Interval(float(x.mean() - half), float(x.mean() + half), "t")
